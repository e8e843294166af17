"""The one error family of neuron-dynamo.

Every error the project raises on purpose is a `NeuronDynamoError`, so a caller can catch the backend's
complaints without catching unrelated bugs. Messages name the problem *and* the fix.
"""


class NeuronDynamoError(Exception):
    """Base class of every error raised on purpose by neuron-dynamo."""
