"""Status codes that jitted code returns and the Python side turns into
exceptions.

Every pass and kernel shares this one numbering, so a status means the same
thing wherever it comes from.
"""
OK = 0
NEED_SPACE = 1         # a graph pass filled the node table: grow it and resume
ERR_NO_RULE = 2        # a gradient flows through an op without a gradient rule
ERR_BAD_NODE = 3       # a node id outside the graph
ERR_INDEX = 4          # an index operand out of range or not an integer (detail: its position)
ERR_NOT_COMPILED = 5   # an opcode without a runner in the table (a bug: programs compile what they use)
ERR_BAD_RULE = 6       # a gradient rule's emission names an axis outside the padded shape (a bug in the rule)
