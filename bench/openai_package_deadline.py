"""Does the ``openai`` package bound a call whose server trickles its body? (docs/architecture.md)

    pip install openai && python bench/openai_package_deadline.py

A loopback server answers a chat completion with headers and then one byte every 0.5 s; the
client is ``openai.OpenAI(timeout=2.0, max_retries=0)``. Prints how the call ended and when, or
that it was still running after ``--wait`` seconds. ``oir_gym``'s own client
(``OpenAIBackend(timeout=2)``) ends such a call at its deadline (``tests/test_openai_hostile.py``).
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time


def trickling_server() -> tuple[socket.socket, int]:
    """A loopback server that sends a 200 with a long body, one byte every 0.5 s (at most 200)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()

    def handle(conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n"
                         b"Connection: close\r\n\r\n")
            for _ in range(200):
                conn.sendall(b" ")
                time.sleep(0.5)
        except OSError:
            pass
        finally:
            conn.close()

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return sock, sock.getsockname()[1]


def main(argv=None) -> int:
    from oir_gym.validation import real_arg

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--timeout", type=real_arg(0, low_open=True), default=2.0, help="the client's timeout (s)")
    p.add_argument("--wait", type=real_arg(0, low_open=True), default=25.0, help="how long to wait for the call (s)")
    args = p.parse_args(argv)
    try:
        import openai
    except ImportError:
        print("the openai package is not installed (pip install openai)", file=sys.stderr)
        return 2
    sock, port = trickling_server()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", timeout=args.timeout, max_retries=0)
    result: dict = {}

    def call() -> None:
        t = time.time()
        try:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            result["how"] = "returned"
        except Exception as e:  # noqa: BLE001 - what ended the call is the answer
            result["how"] = f"raised {type(e).__name__}"
        result["s"] = time.time() - t

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(args.wait)
    how = f"{result['how']} after {result['s']:.1f} s" if result else f"still running after {args.wait:.0f} s"
    print(f"| openai {openai.__version__} | timeout={args.timeout} | {how} |")
    sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
