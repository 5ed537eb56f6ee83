// Validates custom resources against the schemas published in the npm packages
// @kubernetes-models/prometheus-operator, @kubernetes-models/keda and
// @kubernetes-models/gateway-api (generated from the
// upstream CRDs' openAPIV3Schema and shipped as compiled Ajv validators).
//
//   node validate.mjs NODE_MODULES_DIR < resources.json
//
// stdin: a JSON array of resources. stdout: a JSON array, one entry per resource:
// {"kind", "name", "schema", "valid", "errors"}. Exit 0 when every resource has a schema and
// is valid, 1 otherwise; a resource without a known schema is an error, never skipped.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const SCHEMAS = {
  "monitoring.coreos.com/v1/ServiceMonitor": [
    "@kubernetes-models/prometheus-operator",
    "ComGithubPrometheusOperatorPrometheusOperatorPkgApisMonitoringV1ServiceMonitor.js",
  ],
  "monitoring.coreos.com/v1/PrometheusRule": [
    "@kubernetes-models/prometheus-operator",
    "ComGithubPrometheusOperatorPrometheusOperatorPkgApisMonitoringV1PrometheusRule.js",
  ],
  "gateway.networking.k8s.io/v1/HTTPRoute": [
    "@kubernetes-models/gateway-api",
    "IoK8sSigsGatewayApiApisV1HTTPRoute.js",
  ],
  "keda.sh/v1alpha1/ScaledObject": [
    "@kubernetes-models/keda",
    "ComGithubKedacoreKedaV2ApisKedaV1alpha1ScaledObject.js",
  ],
  "keda.sh/v1alpha1/TriggerAuthentication": [
    "@kubernetes-models/keda",
    "ComGithubKedacoreKedaV2ApisKedaV1alpha1TriggerAuthentication.js",
  ],
};

const modules = process.argv[2];
if (!modules) {
  console.error("usage: node validate.mjs NODE_MODULES_DIR < resources.json");
  process.exit(2);
}
const resources = JSON.parse(readFileSync(0, "utf8"));
const results = [];
let ok = true;
for (const res of resources) {
  const key = `${res.apiVersion}/${res.kind}`;
  const entry = SCHEMAS[key];
  const name = res.metadata?.name ?? "";
  if (!entry) {
    ok = false;
    results.push({ kind: key, name, schema: null, valid: false, errors: ["no published schema known for " + key] });
    continue;
  }
  const [pkg, file] = entry;
  const version = JSON.parse(readFileSync(join(modules, pkg, "package.json"), "utf8")).version;
  const { validate } = await import(pathToFileURL(join(modules, pkg, "_schemas", file)).href);
  const valid = validate(res);
  if (!valid) ok = false;
  results.push({ kind: key, name, schema: `${pkg}@${version}/_schemas/${file}`, valid, errors: validate.errors ?? [] });
}
console.log(JSON.stringify(results, null, 1));
process.exit(ok ? 0 : 1);
