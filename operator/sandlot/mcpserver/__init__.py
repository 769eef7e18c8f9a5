"""``sandlot mcp``: sandboxes as Model Context Protocol tools, over stdio.

``tools`` maps each tool's arguments to ``sandlot.client`` calls and the SDK's
results and errors to what a model reads; ``server`` registers those tools with
the ``mcp`` package's server. Everything acts as the kubeconfig's identity, through
the SDK alone (never the operator's or the agent's code).
"""
