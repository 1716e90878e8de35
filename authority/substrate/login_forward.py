"""The login port of one netns node: a TCP relay from a listening socket on the host to the node's sshd.

Started by authority/substrate/login.py as `ip netns exec <ns> python login_forward.py --fd N --to 127.0.0.1:22`:
the listening socket (fd N) was bound in the host's network namespace by the driver and inherited, while
this process runs in the node's namespace, so every connection it makes reaches the node's loopback. No
Linux bridge, no veth to the host and no route between the host and the node exist: the node can reach
nothing on the host through it. Standalone on purpose (no slicex import): it outlives the aggregate process
(a restart or kill -9 of the aggregate leaves logins working) and starts fast."""

from __future__ import annotations

import argparse
import socket
import threading


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _serve(conn: socket.socket, to: tuple[str, int]) -> None:
    try:
        upstream = socket.create_connection(to, timeout=10)
    except OSError:
        conn.close()
        return
    upstream.settimeout(None)
    back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
    back.start()
    _pump(conn, upstream)
    back.join()
    conn.close()
    upstream.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--fd", type=int, required=True, help="inherited listening socket (bound on the host)")
    ap.add_argument("--to", default="127.0.0.1:22", help="host:port inside this namespace")
    ap.add_argument("--netns", default="", help="the node's namespace (for ps and the driver's pid check)")
    args = ap.parse_args()
    host, _, port = args.to.rpartition(":")
    listener = socket.socket(fileno=args.fd)
    while True:
        conn, _addr = listener.accept()
        threading.Thread(target=_serve, args=(conn, (host, int(port))), daemon=True).start()


if __name__ == "__main__":
    main()
