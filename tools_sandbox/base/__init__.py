"""The base every other layer stands on: data shapes, errors, settings, tiers, the wire protocol with the
supervisor, the sandbox's Redis keys and quota gate, metrics, the one renderer, and the seam a backend
implements (`backend.SandboxBackend`). Imports nothing of tools_sandbox outside base/."""
