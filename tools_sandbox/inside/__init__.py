"""What runs inside the sandbox: the supervisor (`_agent.py`), sent as `python3 -c` source to every sandbox.

Nothing here is imported by the host: base/protocol.py reads `_agent.py` as text. It uses the standard
library only, and imports nothing of tools_sandbox (the sandbox has none of it).
"""
