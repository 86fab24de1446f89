// Runs smollm2.spec.mjs (see run_smollm2.sh) and writes out/smollm2.json:
// browser and CLI numbers side by side.
import fs from 'node:fs';
import { serve } from './server.mjs';
import * as smollm2 from './smollm2.spec.mjs';

const env = (k) => { if (!process.env[k]) throw new Error(`${k} is not set (use run_smollm2.sh)`); return process.env[k]; };
const [dist, work, out, gguf] = ['E2E_DIST', 'E2E_WORK', 'E2E_OUT', 'E2E_SMOLLM2'].map(env);
const tokens = Number(process.env.E2E_TOKENS || 1024);
let failures = 0;
const check = (ok, what) => { console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`); if (!ok) failures++; };
const log = (s) => console.log(`     ${s}`);
const srv = await serve(dist);
try {
  const r = await smollm2.run({ url: srv.url, work, out, check, log, gguf, tokens });
  const cli = JSON.parse(fs.readFileSync(`${out}/cli_timings_smollm2.json`, 'utf8'));
  r.summary = {
    tokens_per_domain: tokens,
    upcycle_ms: { browser: r.upcycle.upcycle_ms, cli: cli.upcycle_ms },
    route_ms: { browser_statistics_and_solve: r.route.route_ms, browser_whole_step: r.route.route_step_ms, cli: cli.route_ms },
    graft_ms: { browser: r.graft.graft_ms, cli: cli.graft_ms },
    accuracy: { browser: r.route.accuracy, cli: r.route.cli_accuracy },
    // null: chromium canceled that download, not compared.
    sha256_equal_cli: Object.fromEntries([['upcycle', r.upcycle], ['graft', r.graft]]
      .map(([k, x]) => [k, x.sha256.startsWith('download') ? null : x.sha256_equal_cli])),
    graft_after_router_same_tab: r.route.graft_after_route,
  };
  fs.writeFileSync(`${out}/smollm2.json`, JSON.stringify(r, null, 2));
  console.log(JSON.stringify(r.summary, null, 2));
} catch (e) {
  failures++;
  console.log(`FAIL ${e.stack || e}`);
} finally {
  await srv.close();
}
console.log(failures ? `${failures} check(s) failed` : 'all checks passed');
process.exit(failures ? 1 : 0);
