"""POST a JSON body over HTTPS with Python's own TLS stack, trusting one CA.

usage: https_post.py URL CA_FILE BODY_FILE
Prints the HTTP status on the first line and the response body after it.

A server may answer before it has read the whole body (413 for a body
over its limit, judged by Content-Length) and close the connection; the
rest of the upload then fails. The answer was sent before the close, so
it is still read, as a browser or Go's client does.
"""
import http.client
import ssl
import sys
import urllib.parse

url, ca_file, body_file = sys.argv[1:4]
context = ssl.create_default_context(cafile=ca_file)
with open(body_file, "rb") as f:
    body = f.read()
target = urllib.parse.urlsplit(url)
connection = http.client.HTTPSConnection(target.hostname, target.port, context=context, timeout=30)
try:
    connection.request("POST", target.path, body=body, headers={"Content-Type": "application/json"})
except (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
    pass
response = connection.getresponse()
print(response.status)
print(response.read().decode())
