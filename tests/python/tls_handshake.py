"""A TLS handshake between a server holding a certificate and key, and a
client that trusts only a CA bundle and asks for a server name: does the
pair serve that name under that CA?

Reads {"cert": B64, "key": B64, "ca": B64, "server_name": NAME} (base64 of
PEM, as in a kubernetes.io/tls Secret and a webhook's caBundle) on stdin
and prints {"ok": true, "dns_names": [...]} or {"ok": false, "error": ...}.
"""

import base64
import json
import os
import socket
import ssl
import sys
import tempfile
import threading


def main():
    request = json.load(sys.stdin)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name in ("cert", "key"):
            paths[name] = os.path.join(tmp, name + ".pem")
            with open(paths[name], "wb") as f:
                f.write(base64.b64decode(request[name]))
        server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_context.load_cert_chain(paths["cert"], paths["key"])
        client_context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client_context.load_verify_locations(cadata=base64.b64decode(request["ca"]).decode())
        left, right = socket.socketpair()
        server_error = []

        def serve():
            try:
                with server_context.wrap_socket(right, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError) as error:
                server_error.append(str(error))

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            with client_context.wrap_socket(left, server_hostname=request["server_name"]) as tls:
                peer = tls.getpeercert()
                tls.send(b"x")
            names = [value for kind, value in peer.get("subjectAltName", ()) if kind == "DNS"]
            result = {"ok": True, "dns_names": names}
        except (ssl.SSLError, OSError) as error:
            result = {"ok": False, "error": str(error)}
        thread.join(timeout=10)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
