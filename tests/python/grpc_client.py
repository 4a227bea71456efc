"""Calls the plugin's sockets with Python grpcio and default channel options.

Usage: grpc_client.py REGISTRATION_SOCKET DRA_SOCKET

No generated stubs: requests are encoded by hand (they are tiny), and the
responses are printed as hex for the Rust test to decode with its own
types. Prints one line per call: `<method> ok <hex>` or
`<method> error <code> <details>`.
"""

import sys

import grpc


def call(socket, method, request):
    with grpc.insecure_channel("unix:" + socket) as channel:
        rpc = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            response = rpc(request, timeout=20)
            print(f"{method} ok {response.hex()}")
        except grpc.RpcError as e:
            print(f"{method} error {e.code().name} {e.details()}")


def main():
    registration, dra = sys.argv[1], sys.argv[2]
    # InfoRequest is empty.
    call(registration, "/pluginregistration.Registration/GetInfo", b"")
    # NodePrepareResourcesRequest{claims: [Claim{namespace, uid, name}]}:
    # field 1 (claims), each a message with fields 1 namespace, 2 uid, 3 name.
    claim = b""
    for number, value in ((1, b"default"), (2, b"0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a"), (3, b"missing")):
        claim += bytes([number << 3 | 2, len(value)]) + value
    request = bytes([1 << 3 | 2, len(claim)]) + claim
    call(dra, "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources", request)


if __name__ == "__main__":
    main()
