"""`python -m api_stub [--host H] [--port P] [--<fault-field> VALUE ...]`: run the stub server."""

from __future__ import annotations

import argparse

from api_stub.faults import FaultConfig
from api_stub.server import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m api_stub", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900)
    for name, info in FaultConfig.model_fields.items():
        kind = int if info.annotation is int else float
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, default=None,
                            help=info.description)
    args = vars(parser.parse_args(argv))
    host, port = args.pop("host"), args.pop("port")
    faults = FaultConfig.model_validate({k: v for k, v in args.items() if v is not None})
    serve(host, port, faults)


if __name__ == "__main__":
    main()
