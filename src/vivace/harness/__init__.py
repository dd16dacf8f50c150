"""THE agent harness (the product): tools, parallel tool execution, chat format, agent loop.

The same code acts for a developer on their repo (`vivace agent`), for the benchmark and for
RL rollouts: identical tool names, argument schemas, result texts, truncation and errors.
"""
