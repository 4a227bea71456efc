"""POST a JSON body over HTTPS with Python's own TLS stack, trusting one CA.

usage: https_post.py URL CA_FILE BODY_FILE
Prints the HTTP status on the first line and the response body after it.
"""
import ssl
import sys
import urllib.error
import urllib.request

url, ca_file, body_file = sys.argv[1:4]
context = ssl.create_default_context(cafile=ca_file)
with open(body_file, "rb") as f:
    body = f.read()
request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
try:
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        print(response.status)
        print(response.read().decode())
except urllib.error.HTTPError as error:
    print(error.code)
    print(error.read().decode())
