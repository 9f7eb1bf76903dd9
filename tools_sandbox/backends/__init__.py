"""The ways of isolating code, each implementing base.backend.SandboxBackend: Docker (one-shot, or behind
its warm pool), and the weaker process backend; what they share (cgroup reading, frame demuxing, the end of
an execution, owner labels) and the offline build of the Docker image. Imports only base/."""
