"""A fake `neuronx-cc` for the fake-compiler tests: checks its command line, writes an artifact, or misbehaves.

Behaviour from the environment:
  FAKE_NEURONX_CC_LOG      append one JSON line per run: {"argv": [...], "input": <the input file's text>}
  FAKE_NEURONX_CC_MODE     ok (default) | fail (write half a NEFF, exit 1) | hang (sleep forever) |
                           slow (sleep FAKE_NEURONX_CC_SECONDS, then succeed) | empty (exit 0, no NEFF)
"""

import json
import os
import sys
import time


def main(argv):
    if len(argv) < 2 or argv[0] != "compile":
        print(f"usage: neuronx-cc compile <input> --framework XLA --target T --output F, got {argv}", file=sys.stderr)
        return 2
    source_path = argv[1]
    output = argv[argv.index("--output") + 1]
    for required in ("--framework", "--target", "--logical-nc-config"):
        if required not in argv:
            print(f"neuronx-cc: missing {required}", file=sys.stderr)
            return 2
    with open(source_path, encoding="utf-8") as fh:
        source = fh.read()
    if os.environ.get("FAKE_NEURONX_CC_LOG"):
        with open(os.environ["FAKE_NEURONX_CC_LOG"], "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"argv": argv, "input": source, "cwd": os.getcwd()}) + "\n")
    mode = os.environ.get("FAKE_NEURONX_CC_MODE", "ok")
    if mode == "hang":
        while True:
            time.sleep(1)
    if mode == "slow":
        time.sleep(float(os.environ.get("FAKE_NEURONX_CC_SECONDS", "2")))
    if mode == "fail":
        with open(output, "wb") as fh:
            fh.write(b"NEFF-half")
        print("neuronx-cc: internal compiler error (fake)", file=sys.stderr)
        return 70
    if mode == "empty":
        return 0
    with open(output, "wb") as fh:
        fh.write(b"NEFF\0" + source.encode()[:64])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
