"""Renders and lints a Helm chart with Helm v4's own engine (PyPI
helm-python-sdk, which bundles Helm's library; no helm binary, no cluster).

Reads {"chart": DIR, "namespace": NS, "release": NAME, "cases": [{"name":
..., "values": {...}}], "lint": true} on stdin and prints, for each case,
either {"manifests": {template: text}, "lint": {...}} (lint null when the
request says "lint": false) or {"error": message}.
"""

import json
import sys

import helm_python as helm


def main():
    request = json.load(sys.stdin)
    chart = helm.Chart.load(request["chart"])
    results = {}
    for case in request["cases"]:
        values = case["values"]
        try:
            manifests = chart.render(
                values,
                name=request["release"],
                namespace=request["namespace"],
                is_install=True,
            )
        except helm.HelmError as error:
            results[case["name"]] = {"error": str(error)}
            continue
        if not request.get("lint", True):
            results[case["name"]] = {"manifests": manifests, "lint": None}
            continue
        lint = helm.lint(
            request["chart"],
            values,
            strict=True,
            namespace=request["namespace"],
            kube_version=request.get("kube_version"),
        )
        results[case["name"]] = {"manifests": manifests, "lint": lint}
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
