"""The one exception type of the library."""


class GraphError(ValueError):
    """Raised for every invalid graph, argument or feed.

    The message names the tensor (or argument) and says what is wrong with it.
    It subclasses ValueError so ``except ValueError`` keeps working.
    """
