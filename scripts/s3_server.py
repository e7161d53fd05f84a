"""An S3 server on 127.0.0.1 for the object-store tests (tests/object_store.rs): moto's
server mode, from the zarr venv (scripts/zarr-venv.sh).

    s3_server.py          prints `PORT` once it listens, then serves until stdin closes

The test that starts it holds its stdin; when the test ends (or dies), stdin closes and the
server stops, so that no server outlives its test.
"""

import logging
import sys

from moto.server import ThreadedMotoServer


def main():
    # One line per request on stderr would drown the test's own output.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    print(server._server.server_port, flush=True)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main()
