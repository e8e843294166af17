"""Special functions as NKI emitters: the gamma family (lgamma, digamma, polygamma, Hurwitz zeta), Bessel functions,
the error-function inverses and erfcx, and nextafter.

Each is computed in fp32 inside the kernel with the algorithm PyTorch itself uses (aten/src/ATen/native/Math.h:
Cephes rational and Chebyshev expansions, asymptotic series, reflection formulas) with Cephes' published
coefficients, so the two agree to a few fp32 ulps on the whole domain, poles, NaN and infinities included. Where
PyTorch branches on a value, the kernel computes every branch and selects (`nl.where`); where it loops until a value
crosses a bound, the loop is unrolled to the bound. Activations stay inside their valid input ranges (reference/nki.md
§1.9): logs go through `log_of`, and sines of any argument through an exact-enough reduction to [-π/4, π/4].
Derived from the Cephes Math Library (3-Clause BSD, Copyright (c) 2018, Steven Moshier), as PyTorch's Math.h is.
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from neuron_dynamo.lowering.codegen import TILE_SHAPE, Emitter, Tile, emits
from neuron_dynamo.lowering.elementwise import log_of
from neuron_dynamo.lowering.elementwise import refusal as elementwise_refusal
from neuron_dynamo.lowering.generated import run_single
from neuron_dynamo.lowering.math_functions import ERFC_POLY, activation
from neuron_dynamo.lowering.math_functions import sign_bit as tile_sign_bit
from neuron_dynamo.lowering.math_functions import sqrt as tile_sqrt
from neuron_dynamo.lowering.registry import lowers

aten = torch.ops.aten

F32 = "float32"


# ------------------------------------------------------------------------------------------------ fp32 expressions
class Value:
    """An fp32 tile being computed: Python arithmetic on it writes NKI ALU calls, so Cephes' formulas read as
    written. Division multiplies by the VectorE reciprocal (the engines have no divide)."""

    def __init__(self, e: Emitter, tile: Tile) -> None:
        self.e = e
        self.tile = tile

    def _call(self, fn: str, *args) -> Value:
        return Value(self.e, self.e.call(fn, *(a.tile if isinstance(a, Value) else float(a) for a in args),
                                         dtype=F32))

    def __add__(self, other) -> Value:
        return self._call("nl.add", self, other)

    __radd__ = __add__

    def __sub__(self, other) -> Value:
        return self._call("nl.subtract", self, other)

    def __rsub__(self, other) -> Value:
        return self._call("nl.subtract", other, self)

    def __mul__(self, other) -> Value:
        return self._call("nl.multiply", self, other)

    __rmul__ = __mul__

    def __truediv__(self, other) -> Value:
        if isinstance(other, Value):
            return self * other.reciprocal()
        return self * (1.0 / other)

    def __rtruediv__(self, other) -> Value:
        return self.reciprocal() * other

    def __neg__(self) -> Value:
        return self * -1.0

    def reciprocal(self) -> Value:
        return self._call("nl.reciprocal", self)

    def apply(self, fn: str) -> Value:
        """A unary NKI function valid on all reals (abs, exp, floor, trunc, erf)."""
        return self._call(fn, self)

    def _mask(self, fn: str, other) -> Tile:
        return self.e.call(fn, self.tile, other.tile if isinstance(other, Value) else float(other), dtype="uint8")

    def __lt__(self, other) -> Tile:
        return self._mask("nl.less", other)

    def __le__(self, other) -> Tile:
        return self._mask("nl.less_equal", other)

    def __gt__(self, other) -> Tile:
        return self._mask("nl.greater", other)

    def __ge__(self, other) -> Tile:
        return self._mask("nl.greater_equal", other)

    def eq(self, other) -> Tile:
        return self._mask("nl.equal", other)

    def ne(self, other) -> Tile:
        return self._mask("nl.not_equal", other)

    def isnan(self) -> Tile:
        return self.ne(self)


def where(condition: Tile, a, b, e: Emitter | None = None) -> Value:
    """`a` where the 0/1 `condition` is set, else `b` (Values or numbers; `e` needed when both are numbers)."""
    e = e or next(v.e for v in (a, b) if isinstance(v, Value))
    unwrap = [v.tile if isinstance(v, Value) else float(v) for v in (a, b)]
    return Value(e, e.call("nl.where", condition, *unwrap, dtype=F32))


def either(e: Emitter, *masks: Tile) -> Tile:
    result = masks[0]
    for mask in masks[1:]:
        result = e.call("nl.logical_or", result, mask, dtype="uint8")
    return result


def both(e: Emitter, *masks: Tile) -> Tile:
    result = masks[0]
    for mask in masks[1:]:
        result = e.call("nl.logical_and", result, mask, dtype="uint8")
    return result


def as_value(e: Emitter, operand) -> Value:
    """An operand (a tile of any dtype, or a constant) as an fp32 Value."""
    if isinstance(operand, Tile):
        return Value(e, operand if operand.dtype == F32 else e.call("nl.copy", operand, dtype=F32))
    return Value(e, e.call("nl.full", TILE_SHAPE, float(operand), dtype=F32))


def exp(x: Value) -> Value:
    return x.apply("nl.exp")


def log(x: Value) -> Value:
    """The natural log on all of fp32 (`log_of` keeps the activation inside its valid range)."""
    return Value(x.e, log_of(x.e, x.tile))


def sqrt(x: Value) -> Value:
    return Value(x.e, tile_sqrt(x.e, x.tile))


def polevl(x: Value, coefficients) -> Value:
    """Cephes' polevl: c[0]·x^n + ... + c[n], by Horner's rule."""
    result = coefficients[0]
    for c in coefficients[1:]:
        result = result * x + c if isinstance(result, Value) else x * result + c
    return result


def chbevl(x: Value, coefficients) -> Value:
    """Cephes' chbevl: the Chebyshev series Σ c[i]·T_i(x/2), by Clenshaw's recurrence."""
    b0, b1, b2 = coefficients[0], 0.0, 0.0
    for c in coefficients[1:]:
        b2, b1 = b1, b0
        b0 = x * b1 - b2 + c
    return (b0 - b2) * 0.5


def rounded(x: Value) -> Value:
    """x rounded to the nearest integer (ties to even) for |x| < 2**23; larger floats are integers already."""
    nearest = Value(x.e, x.e.call("nl.copy", x.e.call("nl.copy", x.tile, dtype="int32"), dtype=F32))
    return where(x.apply("nl.abs") < 2.0**23, nearest, x)


def sign_bit(x: Value) -> Tile:
    return tile_sign_bit(x.e, x.tile)


# ------------------------------------------------------------------------------------------------ Cephes coefficients
# (torch's float tables; the i1/i1e ones are Cephes' single-precision expansions)
_BESSEL_J0_PP = (0.0007969367292973471, 0.08283523921074408, 1.239533716464143, 5.447250030587687, 8.74716500199817,
    5.303240382353949, 1.0)
_BESSEL_J0_PQ = (0.0009244088105588637, 0.08562884743544745, 1.2535274390105895, 5.470977403304171, 8.761908832370695,
    5.306052882353947, 1.0)
_BESSEL_J0_QP = (-0.011366383889846916, -1.2825271867050931, -19.553954425773597, -93.20601521237683,
    -177.68116798048806, -147.07750515495118, -51.41053267665993, -6.050143506007285)
_BESSEL_J0_QQ = (64.3178256118178, 856.4300259769806, 3882.4018360540163, 7240.467741956525, 5930.727011873169,
    2062.0933166032783, 242.0057402402914)
_BESSEL_J0_RP = (-4794432209.782018, 1956174919465.5657, -249248344360967.72, 9708622510473064.0)
_BESSEL_J0_RQ = (499.563147152651, 173785.4016763747, 48440965.83399621, 11185553704.535683, 2112775201154.892,
    310518229857422.56, 3.1812195594320496e+16, 1.7108629408104315e+18)
_BESSEL_J1_PP = (0.0007621256162081731, 0.07313970569409176, 1.1271960812968493, 5.112079511468076, 8.424045901417724,
    5.214515986823615, 1.0)
_BESSEL_J1_PQ = (0.0005713231280725487, 0.06884559087544954, 1.105142326340617, 5.073863861286015, 8.399855543276042,
    5.209828486823619, 1.0)
_BESSEL_J1_QP = (0.05108625947501766, 4.982138729512334, 75.82382841325453, 366.7796093601508, 710.8563049989261,
    597.4896124006136, 211.68875710057213, 25.207020585802372)
_BESSEL_J1_QQ = (74.23732770356752, 1056.4488603826283, 4986.410583376536, 9562.318924047562, 7997.041604473507,
    2826.1927851763908, 336.0936078106983)
_BESSEL_J1_RP = (-899971225.7055594, 452228297998.19403, -72749424522181.83, 3682957328638529.0)
_BESSEL_J1_RQ = (620.8364781180543, 256987.25675774884, 83514679.14319493, 22151159547.97925, 4749141220799.914,
    784369607876235.9, 8.952223361846274e+16, 5.322786203326801e+18)
_BESSEL_Y0_YP = (15592.436785523574, -14663929.59039716, 5435264770.518765, -982136065717.9115, 87590639439536.7,
    -3466283033847297.0, 4.4273326857256984e+16, -1.8495080043698668e+16)
_BESSEL_Y0_YQ = (1041.2835366425984, 626107.330137135, 268919633.39381415, 86400248710.3935, 20297961275010.555,
    3171577528429750.5, 2.5059625617265306e+17)
_BESSEL_Y1_YP = (1263204747.9017804, -647355876379.1603, 114509511541823.73, -8127702555013251.0,
    2.024394757135949e+17, -7.788771962659501e+17)
_BESSEL_Y1_YQ = (594.3015923461282, 235564.09294306856, 73481194.44597217, 18760131610.870617, 3882312774962.3857,
    620557727146953.8, 6.871410873553005e+16, 3.9727060811656064e+18)
_I0E_A = (-4.4153416464793395e-18, 3.3307945188222384e-17, -2.431279846547955e-16, 1.715391285555133e-15,
    -1.1685332877993451e-14, 7.676185498604936e-14, -4.856446783111929e-13, 2.95505266312964e-12,
    -1.726826291441556e-11, 9.675809035373237e-11, -5.189795601635263e-10, 2.6598237246823866e-09,
    -1.300025009986248e-08, 6.046995022541919e-08, -2.670793853940612e-07, 1.1173875391201037e-06,
    -4.4167383584587505e-06, 1.6448448070728896e-05, -5.754195010082104e-05, 0.00018850288509584165,
    -0.0005763755745385824, 0.0016394756169413357, -0.004324309995050576, 0.010546460394594998, -0.02373741480589947,
    0.04930528423967071, -0.09490109704804764, 0.17162090152220877, -0.3046826723431984, 0.6767952744094761)
_I0E_B = (-7.233180487874754e-18, -4.830504485944182e-18, 4.46562142029676e-17, 3.461222867697461e-17,
    -2.8276239805165836e-16, -3.425485619677219e-16, 1.7725601330565263e-15, 3.8116806693526224e-15,
    -9.554846698828307e-15, -4.150569347287222e-14, 1.54008621752141e-14, 3.8527783827421426e-13,
    7.180124451383666e-13, -1.7941785315068062e-12, -1.3215811840447713e-11, -3.1499165279632416e-11,
    1.1889147107846439e-11, 4.94060238822497e-10, 3.3962320257083865e-09, 2.266668990498178e-08,
    2.0489185894690638e-07, 2.8913705208347567e-06, 6.889758346916825e-05, 0.0033691164782556943, 0.8044904110141088)
_I1E_A = (9.381537386495773e-09, -4.445059128796328e-08, 2.0032947535521353e-07, -8.568720264695455e-07,
    3.4702513081376785e-06, -1.3273163656039436e-05, 4.781565107550054e-05, -0.00016176081582589674,
    0.0005122859561685758, -0.0015135724506312532, 0.004156422944312888, -0.010564084894626197, 0.024726449030626516,
    -0.05294598120809499, 0.1026436586898471, -0.17641651835783406, 0.25258718644363365)
_I1E_B = (-3.835380385964237e-09, -2.6314688468895196e-08, -2.512236237870209e-07, -3.882564808877691e-06,
    -0.00011058893876262371, -0.009761097491361469, 0.7785762350182801)
_MODIFIED_BESSEL_I1_A = (2.7779141127610464e-18, -2.111421214358166e-17, 1.5536319577362005e-16,
    -1.1055969477353862e-15, 7.600684294735408e-15, -5.042185504727912e-14, 3.223793365945575e-13,
    -1.9839743977649436e-12, 1.1736186298890901e-11, -6.663489723502027e-11, 3.625590281552117e-10,
    -1.8872497517228294e-09, 9.381537386495773e-09, -4.445059128796328e-08, 2.0032947535521353e-07,
    -8.568720264695455e-07, 3.4702513081376785e-06, -1.3273163656039436e-05, 4.781565107550054e-05,
    -0.00016176081582589674, 0.0005122859561685758, -0.0015135724506312532, 0.004156422944312888,
    -0.010564084894626197, 0.024726449030626516, -0.05294598120809499, 0.1026436586898471, -0.17641651835783406,
    0.25258718644363365)
_MODIFIED_BESSEL_I1_B = (7.517296310842105e-18, 4.414348323071708e-18, -4.6503053684893586e-17,
    -3.209525921993424e-17, 2.96262899764595e-16, 3.3082023109209285e-16, -1.8803547755107825e-15,
    -3.8144030724370075e-15, 1.0420276984128802e-14, 4.272440016711951e-14, -2.1015418427726643e-14,
    -4.0835511110921974e-13, -7.198551776245908e-13, 2.0356285441470896e-12, 1.4125807436613782e-11,
    3.2526035830154884e-11, -1.8974958123505413e-11, -5.589743462196584e-10, -3.835380385964237e-09,
    -2.6314688468895196e-08, -2.512236237870209e-07, -3.882564808877691e-06, -0.00011058893876262371,
    -0.009761097491361469, 0.7785762350182801)
_MODIFIED_BESSEL_K0_A = (1.374465435613523e-16, 4.25981614279661e-14, 1.0349695257633842e-11, 1.904516377220209e-09,
    2.5347910790261494e-07, 2.286212103119452e-05, 0.001264615411446926, 0.0359799365153615, 0.3442898999246285,
    -0.5353273932339028)
_MODIFIED_BESSEL_K0_B = (5.300433772686263e-18, -1.6475804301524212e-17, 5.2103915050390274e-17,
    -1.678231096805412e-16, 5.512055978524319e-16, -1.848593377343779e-15, 6.3400764774050706e-15,
    -2.2275133269916698e-14, 8.032890775363575e-14, -2.9800969231727303e-13, 1.140340588208475e-12,
    -4.514597883373944e-12, 1.8559491149547177e-11, -7.957489244477107e-11, 3.577397281400301e-10,
    -1.69753450938906e-09, 8.574034017414225e-09, -4.660489897687948e-08, 2.766813639445015e-07,
    -1.8317555227191195e-06, 1.39498137188765e-05, -0.00012849549581627802, 0.0015698838857300533,
    -0.0314481013119645, 2.4403030820659555)
_MODIFIED_BESSEL_K1_A = (-7.023863479386288e-18, -2.427449850519366e-15, -6.666901694199329e-13,
    -1.4114883926335278e-10, -2.213387630734726e-08, -2.4334061415659684e-06, -0.0001730288957513052,
    -0.006975723859639864, -0.12261118082265715, -0.3531559607765449, 1.5253002273389478)
_MODIFIED_BESSEL_K1_B = (-5.756744483665017e-18, 1.7940508731475592e-17, -5.689462558442859e-17,
    1.838093544366639e-16, -6.057047248373319e-16, 2.038703165624334e-15, -7.019837090418314e-15,
    2.4771544244813043e-14, -8.976705182324994e-14, 3.3484196660784293e-13, -1.2891739609510289e-12,
    5.13963967348173e-12, -2.1299678384275683e-11, 9.218315187605006e-11, -4.1903547593418965e-10,
    2.015049755197033e-09, -1.0345762465678097e-08, 5.7410841254500495e-08, -3.5019606030878126e-07,
    2.406484947837217e-06, -1.936197974166083e-05, 0.00019521551847135162, -0.002857816859622779, 0.10392373657681724,
    2.7206261904844427)
_NDTRI_P0 = (-59.96335010141079, 98.00107541859997, -56.67628574690703, 13.931260938727968, -1.2391658386738125)
_NDTRI_Q0 = (1.0, 1.9544885833814176, 4.676279128988815, 86.36024213908905, -225.46268785411937, 200.26021238006066,
    -82.03722561683334, 15.90562251262117, -1.1833162112133)
_NDTRI_P1 = (4.0554489230596245, 31.525109459989388, 57.16281922464213, 44.08050738932008, 14.684956192885803,
    2.1866330685079025, -0.1402560791713545, -0.03504246268278482, -0.0008574567851546854)
_NDTRI_Q1 = (1.0, 15.779988325646675, 45.39076351288792, 41.3172038254672, 15.04253856929075, 2.504649462083094,
    -0.14218292285478779, -0.03808064076915783, -0.0009332594808954574)
_NDTRI_P2 = (3.2377489177694603, 6.915228890689842, 3.9388102529247444, 1.3330346081580755, 0.20148538954917908,
    0.012371663481782003, 0.00030158155350823543, 2.6580697468673755e-06, 6.239745391849833e-09)
_NDTRI_Q2 = (1.0, 6.02427039364742, 3.6798356385616087, 1.3770209948908132, 0.21623699359449663, 0.013420400608854318,
    0.00032801446468212774, 2.8924786474538068e-06, 6.790194080099813e-09)


# ------------------------------------------------------------------------------------------------ sine and cosine
# π/2 in four 12-bit parts and a remainder: k·part is exact in fp32 for the 12-bit halves of any fp32 integer k
_HALF_PI_PARTS = (1.57080078125, -4.453584551811218e-06, -8.706138032721356e-10, 6.222800053024002e-14,
                  5.721188726109832e-18)
_REDUCIBLE = 2.0**30  # beyond, k no longer fits int32: Bessel amplitudes are below 3e-5 there (see `sin_cos`)


def _split(k: Value) -> tuple[Value, Value]:
    """k = high + low with each part at most 12 significant bits (Veltkamp), so part·(12-bit constant) is exact."""
    c = k * 4097.0
    high = c - (c - k)
    return high, k - high


def _reduce(a: Value) -> tuple[Value, Tile]:
    """a - k·π/2 for the k nearest a·2/π, and k modulo 4 (an int32 in [-1, 4]): the k·part products are exact,
    so the reduced argument keeps about 40 bits of π/2 for |a| up to 2**30 (a second pass cleans up a k that fp32
    rounded)."""
    e = a.e
    quadrant = e.call("nl.copy", (a * (2.0 / math.pi)).tile, dtype="int32")
    k = Value(e, e.call("nl.copy", quadrant, dtype=F32))
    quadrant = e.call("nl.copy", k.tile, dtype="int32")  # the integer k really is, once fp32 rounded it
    high, low = _split(k)
    r = a
    for part in _HALF_PI_PARTS[:4]:
        r = r - high * part - low * part
    r = r - k * _HALF_PI_PARTS[4]
    extra = e.call("nl.copy", (r * (2.0 / math.pi)).tile, dtype="int32")
    r = r - Value(e, e.call("nl.copy", extra, dtype=F32)) * _HALF_PI_PARTS[0]
    for part in _HALF_PI_PARTS[1:3]:
        r = r - Value(e, e.call("nl.copy", extra, dtype=F32)) * part
    return r, e.call("nl.add", e.call("nl.bitwise_and", quadrant, 3, dtype="int32"), extra, dtype="int32")


def sin_cos(a: Value) -> tuple[Value, Value]:
    """sin(a) and cos(a) of an fp32 argument, to a few ulps for |a| ≤ 2**30 (torch's float sin and cos are exact
    for every float). Beyond, both are replaced by 0 and 1: the only callers there scale them by Bessel
    amplitudes √(2/(πa)) below 3e-5, inside the tolerance; infinities and NaN give NaN."""
    e = a.e
    finite = a.apply("nl.abs") <= _REDUCIBLE
    r, quadrant = _reduce(where(finite, a, 0.0))
    sin_r = Value(e, activation(e, "nl.sin", r.tile))
    cos_r = Value(e, activation(e, "nl.sin", (r.apply("nl.abs") * -1.0 + math.pi / 2).tile))
    q = e.call("nl.bitwise_and", quadrant, 3, dtype="int32")
    odd = e.call("nl.bitwise_and", q, 1, dtype="uint8")
    flip_sin = e.call("nl.greater", q, 1, dtype="uint8")
    flip_cos = e.call("nl.logical_xor", flip_sin, odd, dtype="uint8")
    sine = where(odd, cos_r, sin_r)
    cosine = where(odd, sin_r, cos_r)
    sine = where(flip_sin, -sine, sine)
    cosine = where(flip_cos, -cosine, cosine)
    nan = a.isnan()
    infinite = a.apply("nl.abs").eq(math.inf)
    bad = either(e, nan, infinite)
    sine = where(bad, math.nan, where(finite, sine, 0.0))
    cosine = where(bad, math.nan, where(finite, cosine, 1.0))
    return sine, cosine


def sin_pi(r: Value) -> Value:
    """sin(π·r) for |r| ≤ 1/2 (inside the activation's range)."""
    return Value(r.e, activation(r.e, "nl.sin", (r * math.pi).tile))


def cos_pi(r: Value) -> Value:
    """cos(π·r) for |r| ≤ 1/2, as sin(π/2 - π|r|)."""
    return Value(r.e, activation(r.e, "nl.sin", (r.apply("nl.abs") * -math.pi + math.pi / 2).tile))


# ------------------------------------------------------------------------------------------------ the gamma family
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LGAMMA_SHIFT = 8  # Stirling's series is exact to fp32 from 8 on


def _lgamma_positive(z: Value) -> Value:
    """log Γ(z) for z ≥ 0: Stirling's series from 8 on, below that log Γ(z + 8) - log(z (z+1) ... (z+7))."""
    small = z < float(_LGAMMA_SHIFT)
    product = z
    for k in range(1, _LGAMMA_SHIFT):
        product = product * (z + float(k))
    w = where(small, z + float(_LGAMMA_SHIFT), z)
    log_w = log(w)
    inv = w.reciprocal()
    inv2 = inv * inv
    series = inv * ((inv2 * (1.0 / 1260.0) - 1.0 / 360.0) * inv2 + 1.0 / 12.0)
    stirling = w * (log_w - 1.0) - log_w * 0.5 + _HALF_LOG_2PI + series  # z·(log z - 1) first: no early overflow
    result = where(small, stirling - log(where(small, product, 1.0)), stirling)
    return where(z.eq(math.inf), math.inf, result)


def lgamma(x: Value) -> Value:
    """log|Γ(x)|: the reflection log π - log|sin(πx)| - log Γ(1 - x) below 0, with sin(πx) from x minus its
    nearest integer (exact); +inf at 0, at the negative integers and at ±inf, as C's lgammaf."""
    negative = x < 0.0
    r = x - rounded(x)
    sine = sin_pi(r.apply("nl.abs"))
    reflected = math.log(math.pi) - log(sine) - _lgamma_positive(where(negative, 1.0 - x, 1.0))
    pole = both(x.e, negative, r.eq(0.0))
    result = where(negative, where(pole, math.inf, reflected), _lgamma_positive(where(negative, 1.0, x)))
    return where(x.eq(-math.inf), math.inf, result)


_PSI_10 = 2.25175258906672110764
_DIGAMMA_ASYMPTOTIC = (8.33333333333333333333e-2, -2.10927960927960927961e-2, 7.57575757575757575758e-3,
                       -4.16666666666666666667e-3, 3.96825396825396825397e-3, -8.33333333333333333333e-3,
                       8.33333333333333333333e-2)


def _digamma_positive(z: Value) -> Value:
    """ψ(z) for z > 0 as torch's float digamma: z pushed to 10 or beyond by ψ(z) = ψ(z+1) - 1/z, then the
    asymptotic series (exactly ψ(10) at 10)."""
    result = 0.0
    for _ in range(10):
        below = z < 10.0
        result = where(below, result - z.reciprocal(), result) if isinstance(result, Value) else where(
            below, -z.reciprocal(), 0.0)
        z = where(below, z + 1.0, z)
    inv2 = (z * z).reciprocal()
    tail = where(z < 1.0e17, inv2 * polevl(inv2, _DIGAMMA_ASYMPTOTIC), 0.0)
    asymptotic = result + log(z) - z.reciprocal() * 0.5 - tail
    return where(z.eq(10.0), result + _PSI_10, asymptotic)


def digamma(x: Value) -> Value:
    """ψ(x): the reflection ψ(1 - x) - π/tan(πx) below 0 (tan from x's distance to the nearest integer), NaN at
    the negative integers and -inf, ∓inf at ±0, as torch."""
    e = x.e
    negative = x < 0.0
    fraction = x - rounded(x)
    cot = cos_pi(fraction) / sin_pi(fraction)
    reflected = _digamma_positive(where(negative, 1.0 - x, 1.0)) - cot * math.pi
    integer = x.eq(x.apply("nl.trunc"))
    result = where(negative, where(integer, math.nan, reflected), _digamma_positive(where(negative, 1.0, x)))
    zero = where(sign_bit(x), math.inf, -math.inf, e)
    return where(x.eq(0.0), zero, where(either(e, x.isnan(), x.eq(math.inf)), x, result))


def trigamma(x: Value) -> Value:
    """ψ'(x) exactly as torch's float trigamma: below 1/2 the reflection with sin(fl(π·x)), then six steps of
    ψ'(x) = ψ'(x+1) + 1/x² and the asymptotic series."""
    pi = float(torch.tensor(math.pi, dtype=torch.float32))
    reflect = x < 0.5
    sine, _ = sin_cos(x * pi)
    result = where(reflect, -(float(torch.tensor(pi * pi, dtype=torch.float32)) / (sine * sine)), 0.0)
    z = where(reflect, 1.0 - x, x)
    for _ in range(6):
        result = result + (z * z).reciprocal()
        z = z + 1.0
    ixx = (z * z).reciprocal()
    inner = ((ixx * (-1.0 / 42.0) + 1.0 / 30.0) * ixx * -1.0 + 1.0 / 6.0) * ixx
    result = result + (inner + (z * 2.0).reciprocal() + 1.0) / z
    return where(reflect, -result, result)


# Euler-Maclaurin: (2k)!/B_2k, as Cephes' zeta
_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
           -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15, 1.8152105401943546773e17,
           -7.1661652561756670113e18)
_ZETA_TERMS = 10  # summed directly before the Euler-Maclaurin tail, so the tail starts at q + 10 ≥ 10


def _zeta_positive(s: Value, q: Value) -> Value:
    """ζ(s, q) = Σ (q+k)^-s for q > 0, s > 1 (Cephes): ten terms, then the Euler-Maclaurin tail at w = q + 10
    (powers as exp(-s·log a): the relative error stays below 1e-5 wherever the result is a normal float)."""
    total = 0.0
    a = q
    for _ in range(_ZETA_TERMS):
        total = exp(log(a) * -s) + total
        a = a + 1.0
    w = a
    b = exp(log(w) * -s)
    total = total + b * w / (s - 1.0) + b * 0.5
    factor, inv_w = 1.0, w.reciprocal()
    b = b * inv_w
    for k, divisor in enumerate(_ZETA_A):
        factor = (s + float(2 * k)) * factor
        total = total + factor * b * (1.0 / divisor)
        factor = factor * (s + float(2 * k + 1))
        b = b * inv_w * inv_w
    return total


def zeta(s: Value, q: Value) -> Value:
    """The Hurwitz zeta function ζ(s, q) as torch's: inf at s = 1 and at the non-positive integers q, NaN for
    s < 1 or a non-integer s with q ≤ 0. For q < 0 (s an integer) the sum splits into terms at positive
    arguments: ζ(s, q) = ζ(s, f) + (-1)^s (ζ(s, 1 - f) - ζ(s, 1 - q)), f = q - floor(q)."""
    e = s.e
    negative = q <= 0.0
    f = q - q.apply("nl.floor")
    positive = _zeta_positive(s, where(negative, 1.0, q))
    parity = e.call("nl.bitwise_and", e.call("nl.copy", s.apply("nl.abs").tile, dtype="int32"), 1, dtype="uint8")
    huge_s = s.apply("nl.abs") >= 2.0**24  # every such float is even
    sign = where(both(e, parity, e.call("nl.logical_not", huge_s, dtype="uint8")), -1.0, 1.0, e)
    f_safe = where(negative, f, 0.5)
    one_minus_f = where(negative, q.apply("nl.ceil") - q, 0.5)  # exact where small, unlike 1 - f
    mirrored = _zeta_positive(s, one_minus_f) - _zeta_positive(s, where(negative, 1.0 - q, 1.0))
    reflected = _zeta_positive(s, f_safe) + sign * mirrored
    integer_s = s.eq(s.apply("nl.floor"))
    pole = either(e, f.eq(0.0), q.eq(-math.inf))
    reflected = where(pole, math.inf, where(integer_s, reflected, math.nan))
    result = where(negative, reflected, positive)
    # s = inf: torch's terms (q+k)^-s are 0, 1 or inf: 1 at q = 1, inf below, and NaN above (its tail's 0·inf)
    infinite_s = where(q.eq(1.0), 1.0, where(q < 1.0, math.inf, math.nan, e))
    result = where(s.eq(math.inf), infinite_s, result)
    return where(s.eq(1.0), math.inf, where(s < 1.0, math.nan, result))


def polygamma(n: int, x: Value) -> Value:
    """ψ^(n)(x): ψ and ψ' as torch's float digamma and trigamma, higher orders (-1)^(n+1)·n!·ζ(n+1, x)."""
    if n == 0:
        return digamma(x)
    if n == 1:
        return trigamma(x)
    sign = 1.0 if n % 2 else -1.0
    return zeta(as_value(x.e, float(n + 1)), x) * (sign * math.factorial(n))


# ------------------------------------------------------------------------------------------------ Bessel functions
_SQRT_2_OVER_PI = 0.797884560802865355879892119868763737
_QUARTER_PI = 0.785398163397448309615660845819875721
_THREE_QUARTER_PI = 2.356194490192344928846982537459627163
_TWO_OVER_PI = 0.636619772367581343075535053490057448


def _hankel(x: Value, p, q, phase: float, w: Value) -> tuple[Value, Value, Value, Value]:
    """The large-argument pieces of J and Y (x > 5): P = PP/PQ, Q = 5/x·QP/QQ in w, sin and cos of x - phase."""
    pp, pq, qp, qq = p[0], p[1], q[0], q[1]
    big_p = polevl(w, pp) / polevl(w, pq)
    big_q = polevl(w, qp) / polevl(w, qq) * (x.reciprocal() * 5.0)
    sine, cosine = sin_cos(x - phase)
    return big_p, big_q, sine, cosine


def _amplitude(x: Value) -> Value:
    return sqrt(x).reciprocal() * _SQRT_2_OVER_PI


def _j0(x: Value) -> Value:
    """J0 of |x| (Cephes j0): a rational function times (x² - z1²)(x² - z2²) up to 5, Hankel's form beyond."""
    x = x.apply("nl.abs")
    x2 = x * x
    near = (x2 - 5.78318596294678452118) * (x2 - 3.04712623436620863991e1) * polevl(x2, _BESSEL_J0_RP) / polevl(
        x2, _BESSEL_J0_RQ)
    near = where(x < 1e-5, 1.0 - x2 * 0.25, near)
    far_x = where(x <= 5.0, 10.0, x)
    w = (far_x * far_x).reciprocal() * 25.0
    p, q, sine, cosine = _hankel(far_x, (_BESSEL_J0_PP, _BESSEL_J0_PQ), (_BESSEL_J0_QP, _BESSEL_J0_QQ),
                                 _QUARTER_PI, w)
    far = (p * cosine - q * sine) * _amplitude(far_x)
    return where(x <= 5.0, near, far)


def _j1(x: Value) -> Value:
    """J1 (Cephes j1), odd."""
    ax = x.apply("nl.abs")
    x2 = ax * ax
    near = polevl(x2, _BESSEL_J1_RP) / polevl(x2, _BESSEL_J1_RQ) * ax * (x2 - 1.46819706421238932572e1) * (
        x2 - 4.92184563216946036703e1)
    far_x = where(ax <= 5.0, 10.0, ax)
    five = far_x.reciprocal() * 5.0
    p, q, sine, cosine = _hankel(far_x, (_BESSEL_J1_PP, _BESSEL_J1_PQ), (_BESSEL_J1_QP, _BESSEL_J1_QQ),
                                 _THREE_QUARTER_PI, five * five)
    far = (p * cosine - q * sine) * _amplitude(far_x)
    magnitude = where(ax <= 5.0, near, far)
    return where(x < 0.0, -magnitude, magnitude)


def _y0(x: Value) -> Value:
    """Y0 (Cephes y0): -inf at 0, NaN below."""
    x2 = x * x
    near_x = where(x > 0.0, x, 1.0)
    near = polevl(x2, _BESSEL_Y0_YP) / polevl(x2, _BESSEL_Y0_YQ) + log(near_x) * _j0(near_x) * _TWO_OVER_PI
    far_x = where(x <= 5.0, 10.0, x)
    w = (far_x * far_x).reciprocal() * 25.0
    p, q, sine, cosine = _hankel(far_x, (_BESSEL_J0_PP, _BESSEL_J0_PQ), (_BESSEL_J0_QP, _BESSEL_J0_QQ),
                                 _QUARTER_PI, w)
    far = (p * sine + q * cosine) * _amplitude(far_x)
    near = where(x.eq(0.0), -math.inf, where(x < 0.0, math.nan, near))
    return where(x <= 5.0, near, far)


def _y1(x: Value) -> Value:
    """Y1 (Cephes y1): -inf at 0, NaN below."""
    x2 = x * x
    near_x = where(x > 0.0, x, 1.0)
    near = near_x * (polevl(x2, _BESSEL_Y1_YP) / polevl(x2, _BESSEL_Y1_YQ)) + (
        _j1(near_x) * log(near_x) - near_x.reciprocal()) * _TWO_OVER_PI
    far_x = where(x <= 5.0, 10.0, x)
    five = far_x.reciprocal() * 5.0
    p, q, sine, cosine = _hankel(far_x, (_BESSEL_J1_PP, _BESSEL_J1_PQ), (_BESSEL_J1_QP, _BESSEL_J1_QQ),
                                 _THREE_QUARTER_PI, five * five)
    far = (p * sine + q * cosine) * _amplitude(far_x)
    near = where(x.eq(0.0), -math.inf, where(x < 0.0, math.nan, near))
    return where(x <= 5.0, near, far)


def _scaled_i(x: Value, near_coefficients, far_coefficients, odd: bool) -> Value:
    """exp(-|x|)·I_ν(|x|) (Cephes i0e / i1e): Chebyshev series in |x|/2 - 2 up to 8 and in 32/|x| - 2 beyond
    (for I1 the near series is of I1(x)/x); the sign of x for the odd I1."""
    ax = x.apply("nl.abs")
    near = chbevl(ax * 0.5 - 2.0, near_coefficients)
    if odd:
        near = near * ax
    far_x = where(ax <= 8.0, 8.0, ax)
    far = chbevl(far_x.reciprocal() * 32.0 - 2.0, far_coefficients) / sqrt(far_x)
    magnitude = where(ax <= 8.0, near, far)
    return where(x < 0.0, -magnitude, magnitude) if odd else magnitude


def _unscaled_i(x: Value, near_coefficients, far_coefficients, odd: bool) -> Value:
    """I_ν(x) = exp(|x|)·(the scaled series), multiplied in the order torch does (inf stays inf, not inf·0)."""
    scaled = _scaled_i(x, near_coefficients, far_coefficients, odd)
    return scaled * exp(x.apply("nl.abs"))


def _k(x: Value, near_coefficients, far_coefficients, order: int, scaled: bool) -> Value:
    """K0 / K1 (Cephes k0, k1; `scaled` multiplies by e^x): up to 2 a Chebyshev series in x² - 2 plus the log
    term with I_ν, beyond a series in 8/x - 2; inf at 0 and NaN below. (torch's unscaled K0 takes log(x/2) in
    double, so tiny subnormal x do not give log(0): log x - log 2 here.)"""
    near_x = where(x > 0.0, where(x <= 2.0, x, 1.0), 1.0)
    series = chbevl(near_x * near_x - 2.0, near_coefficients)
    if order == 0:
        i0 = _unscaled_i(near_x, _I0E_A, _I0E_B, odd=False)
        near = series - (log(near_x) - math.log(2.0)) * i0 if not scaled else series - log(near_x * 0.5) * i0
    else:
        i1 = _unscaled_i(near_x, _MODIFIED_BESSEL_I1_A, _MODIFIED_BESSEL_I1_B, odd=True)
        near = log(near_x * 0.5) * i1 + series / near_x
    far_x = where(x > 2.0, x, 4.0)
    far = chbevl(far_x.reciprocal() * 8.0 - 2.0, far_coefficients) / sqrt(far_x)
    if scaled:
        near = near * exp(near_x)
    else:
        far = far * exp(-far_x)
    result = where(x <= 2.0, near, far)
    return where(x.eq(0.0), math.inf, where(either(x.e, x < 0.0, x.isnan()), math.nan, result))


def _spherical_j0(x: Value) -> Value:
    """sin(x)/x, a Taylor polynomial below |x| = 1/2, 0 at ±inf."""
    x2 = x * x
    taylor = polevl(x2, [(-1.0) ** k / math.factorial(2 * k + 1) for k in range(6, -1, -1)])
    sine, _ = sin_cos(x)
    far = sine / x
    result = where(x.apply("nl.abs") < 0.5, taylor, far)
    return where(x.apply("nl.abs").eq(math.inf), 0.0, result)


# ------------------------------------------------------------------------------------------------ error functions
_ERFINV_A = (-0.140543331, 0.914624893, -1.645349621, 0.886226899)
_ERFINV_B = (0.012229801, -0.329097515, 1.442710462, -2.118377725, 1.0)
_ERFINV_C = (1.641345311, 3.429567803, -1.624906493, -1.970840454)
_ERFINV_D = (1.637067800, 3.543889200, 1.0)


def erfinv(y: Value) -> Value:
    """erf⁻¹ as torch: a rational first guess (central or tail) and two Newton steps on erf; ±inf at ±1, NaN
    beyond."""
    e = y.e
    ay = y.apply("nl.abs")
    z = y * y
    central = y * polevl(z, _ERFINV_A) / polevl(z, _ERFINV_B)
    t = sqrt(-log(where(ay < 1.0, (1.0 - ay) * 0.5, 0.5)))
    tail = polevl(t, _ERFINV_C) / polevl(t, _ERFINV_D)
    tail = where(sign_bit(y), -tail, tail)
    x = where(ay <= 0.7, central, tail)
    for _ in range(2):
        x = x - (x.apply("nl.erf") - y) / (exp(-(x * x)) * (2.0 / math.sqrt(math.pi)))
    x = where(ay.eq(1.0), where(sign_bit(y), -math.inf, math.inf, e), x)
    return where(either(e, ay > 1.0, y.isnan()), math.nan, x)


_EXP_MINUS_2 = 0.13533528323661269189
_SQRT_2PI = 2.50662827463100050242


def ndtri(y0: Value) -> Value:
    """The inverse of the standard normal CDF (Cephes ndtri): a rational function of y - 1/2 in the middle,
    of 1/sqrt(-2 log y) in the tails."""
    upper = y0 > 1.0 - _EXP_MINUS_2
    y = where(upper, 1.0 - y0, y0)
    middle_y = y - 0.5
    y2 = middle_y * middle_y
    middle = (middle_y + middle_y * (y2 * polevl(y2, _NDTRI_P0) / polevl(y2, _NDTRI_Q0))) * _SQRT_2PI
    x = sqrt(log(where(y > 0.0, y, 0.5)) * -2.0)
    x0 = x - log(x) / x
    z = x.reciprocal()
    x1 = where(x < 8.0, z * polevl(z, _NDTRI_P1) / polevl(z, _NDTRI_Q1), z * polevl(z, _NDTRI_P2) / polevl(
        z, _NDTRI_Q2))
    tail = x0 - x1
    tail = where(upper, tail, -tail)
    result = where(y > _EXP_MINUS_2, middle, tail)
    result = where(y0.eq(0.0), -math.inf, where(y0.eq(1.0), math.inf, result))
    return where(either(y0.e, y0 < 0.0, y0 > 1.0, y0.isnan()), math.nan, result)


def erfcx(x: Value) -> Value:
    """exp(x²)·erfc(x): for x ≥ 0 Numerical Recipes' erfc without its exp(-x²) factor, t·exp(P(t)) with
    t = 1/(1 + x/2) (relative error below 1.2e-7, no overflow); 2·exp(x²) - erfcx(-x) below 0."""
    ax = x.apply("nl.abs")
    t = (ax * 0.5 + 1.0).reciprocal()
    positive = t * exp(polevl(t, ERFC_POLY[::-1]))
    negative = exp(x * x) * 2.0 - positive
    return where(x < 0.0, negative, positive)


# ------------------------------------------------------------------------------------------------ nextafter
def nextafter(x: Value, y: Value) -> Tile:
    """The float after x toward y, from x's bits: the magnitude steps by one unit in the last place (as two exact
    16-bit halves with a carry: the engines add integers in fp32), ±0 steps to the smallest subnormal."""
    e = x.e
    bits = e.view(x.tile, "int32")
    high = e.call("nl.right_shift", bits, 16, dtype="int32")
    low = e.call("nl.bitwise_and", bits, 0xFFFF, dtype="int32")
    away = e.call("nl.logical_xor", x < y, x < 0.0, dtype="uint8")
    low = e.call("nl.add", low, e.call("nl.where", away, 1, -1, dtype="int32"), dtype="int32")
    carry = e.call("nl.where", e.call("nl.greater", low, 0xFFFF, dtype="uint8"), 1,
                   e.call("nl.where", e.call("nl.less", low, 0, dtype="uint8"), -1, 0, dtype="int32"), dtype="int32")
    high = e.call("nl.add", high, carry, dtype="int32")
    stepped = e.call("nl.bitwise_or", e.call("nl.left_shift", high, 16, dtype="int32"),
                     e.call("nl.bitwise_and", low, 0xFFFF, dtype="int32"), dtype="int32")
    toward_negative = e.call("nl.copy", y < 0.0, dtype="int32")
    smallest = e.call("nl.bitwise_or", e.call("nl.left_shift", toward_negative, 31, dtype="int32"), 1, dtype="int32")
    result = Value(e, e.view(e.call("nl.where", x.eq(0.0), smallest, stepped, dtype="int32"), F32))
    result = where(x.eq(y), y, result)
    return where(either(e, x.isnan(), y.isnan()), math.nan, result).tile


# ------------------------------------------------------------------------------------------------ registration
def _unary(compute):
    """The emitter of a one-operand function: computed in fp32, rounded once into the step's dtype."""

    def emit(e, dt, a):
        return e.call("nl.copy", compute(as_value(e, a)).tile, dtype=dt)

    return emit


for _op, _compute in (
    (aten.lgamma, lgamma), (aten.digamma, digamma), (aten.erfinv, erfinv), (aten.special_ndtri, ndtri),
    (aten.special_erfcx, erfcx), (aten.i0, lambda x: _unscaled_i(x, _I0E_A, _I0E_B, odd=False)),
    (aten.special_i0e, lambda x: _scaled_i(x, _I0E_A, _I0E_B, odd=False)),
    (aten.special_i1, lambda x: _unscaled_i(x, _I1E_A, _I1E_B, odd=True)),
    (aten.special_i1e, lambda x: _scaled_i(x, _I1E_A, _I1E_B, odd=True)),
    (aten.special_bessel_j0, _j0), (aten.special_bessel_j1, _j1), (aten.special_bessel_y0, _y0),
    (aten.special_bessel_y1, _y1),
    (aten.special_modified_bessel_i0, lambda x: _unscaled_i(x, _I0E_A, _I0E_B, odd=False)),
    (aten.special_modified_bessel_i1,
     lambda x: _unscaled_i(x, _MODIFIED_BESSEL_I1_A, _MODIFIED_BESSEL_I1_B, odd=True)),
    (aten.special_modified_bessel_k0,
     lambda x: _k(x, _MODIFIED_BESSEL_K0_A, _MODIFIED_BESSEL_K0_B, order=0, scaled=False)),
    (aten.special_modified_bessel_k1,
     lambda x: _k(x, _MODIFIED_BESSEL_K1_A, _MODIFIED_BESSEL_K1_B, order=1, scaled=False)),
    (aten.special_scaled_modified_bessel_k0,
     lambda x: _k(x, _MODIFIED_BESSEL_K0_A, _MODIFIED_BESSEL_K0_B, order=0, scaled=True)),
    (aten.special_scaled_modified_bessel_k1,
     lambda x: _k(x, _MODIFIED_BESSEL_K1_A, _MODIFIED_BESSEL_K1_B, order=1, scaled=True)),
    (aten.special_spherical_bessel_j0, _spherical_j0),
):
    emits(_op)(_unary(_compute))


@emits(aten.polygamma)
def _polygamma(e, dt, n, a):
    return e.call("nl.copy", polygamma(int(n), as_value(e, a)).tile, dtype=dt)


@emits(aten.special_zeta)
def _zeta(e, dt, s, q):
    return e.call("nl.copy", zeta(as_value(e, s), as_value(e, q)).tile, dtype=dt)


@emits(aten.nextafter)
def _nextafter(e, dt, a, b):
    return nextafter(as_value(e, a), as_value(e, b))


SPECIAL_OPS = (
    aten.lgamma, aten.digamma, aten.polygamma, aten.special_zeta, aten.erfinv, aten.special_ndtri,
    aten.special_erfcx, aten.i0, aten.special_i0e, aten.special_i1, aten.special_i1e, aten.special_bessel_j0,
    aten.special_bessel_j1, aten.special_bessel_y0, aten.special_bessel_y1, aten.special_modified_bessel_i0,
    aten.special_modified_bessel_i1, aten.special_modified_bessel_k0, aten.special_modified_bessel_k1,
    aten.special_scaled_modified_bessel_k0, aten.special_scaled_modified_bessel_k1,
    aten.special_spherical_bessel_j0, aten.nextafter,
)
MAX_POLYGAMMA_ORDER = 12  # beyond, n! and the powers (x+k)^-(n+1) leave the accuracy exp(-s·log a) keeps


def _refuse(node: fx.Node) -> str | None:
    """Why a special-function node runs eagerly (None when the generated kernel computes it)."""
    reason = elementwise_refusal(node)
    if reason is not None:
        return reason
    dtype = node.meta["val"].dtype
    packet = node.target.overloadpacket
    if packet is aten.nextafter and dtype != torch.float32:
        return f"nextafter in {dtype}: the kernel steps fp32 bit patterns only"
    if not dtype.is_floating_point:
        return f"an integer result ({dtype})"
    if packet is aten.polygamma and not 0 <= node.args[0] <= MAX_POLYGAMMA_ORDER:
        return (f"polygamma of order {node.args[0]}: the kernel's Hurwitz zeta keeps 1e-4 accuracy up to order "
                f"{MAX_POLYGAMMA_ORDER}")
    return None


@lowers(*SPECIAL_OPS, family="elementwise")
def special(op, *args, **kwargs):
    """Reference kernel: torch computes the special function."""
    return op(*args, **kwargs)


@lowers(*SPECIAL_OPS, family="elementwise", target="simulator", accepts=_refuse, handles_empty=True)
def special_nki(op, *args, **kwargs):
    """One special function as a generated NKI kernel (fused with its neighbours in a region)."""
    return run_single(op, args, kwargs)
