"""Status codes that jitted code returns and the Python side turns into
exceptions, and the two sentinels a gradient rule may return instead of a node.

Every pass and kernel shares this one numbering, so a status means the same
thing wherever it comes from.
"""
OK = 0
NEED_SPACE = 1         # a graph pass filled the node table: grow it and resume
ERR_NO_RULE = 2        # a gradient flows through an op without a gradient rule
ERR_BAD_NODE = 3       # a node id outside the graph
ERR_INDEX = 4          # an index operand out of range or not an integer (detail: its position)
ERR_NOT_COMPILED = 5   # an opcode without a runner in the table (a bug: programs compile what they use)

# what a gradient rule returns instead of a node id
NO_CONTRIBUTION = -1   # the derivative is zero: nothing flows to this source
NO_RULE = -2           # no rule for this source
