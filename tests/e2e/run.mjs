// Runs the end-to-end specs against a built studio.
// Env: E2E_DIST (frontend/dist with demo/ inside), E2E_WORK (inputs and CLI
// outputs made by run.sh), E2E_SHOTS (screenshot folder), E2E_OUT.
import fs from 'node:fs';
import path from 'node:path';
import { launch, WEBGPU_ARGS } from './browser.mjs';
import { serve } from './server.mjs';
import * as studio from './studio.spec.mjs';
import * as preset from './preset.spec.mjs';
import * as lessons from './lessons.spec.mjs';

const env = (k) => { if (!process.env[k]) throw new Error(`${k} is not set (use run.sh)`); return process.env[k]; };
const [dist, work, shots, out] = ['E2E_DIST', 'E2E_WORK', 'E2E_SHOTS', 'E2E_OUT'].map(env);
fs.mkdirSync(shots, { recursive: true });
fs.mkdirSync(out, { recursive: true });

let failures = 0;
const check = (ok, what) => { console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`); if (!ok) failures++; };
const log = (s) => console.log(`     ${s}`);

const srv = await serve(dist);
const browser = await launch(WEBGPU_ARGS);
const t0 = Date.now();
try {
  const results = await studio.run({ context: browser.context, url: srv.url, work, shots, out, check, log });
  results.total_ms = Date.now() - t0;
  // The teaching preset in a fresh browser (nothing kept from the suite
  // above): every page on the first click with its defaults.
  const fresh = await launch(WEBGPU_ARGS);
  try {
    const t1 = Date.now();
    results.preset = await preset.run({ context: fresh.context, url: srv.url, dist, shots, out, check, log });
    results.preset.total_ms = Date.now() - t1;
    log(`preset walk: ${JSON.stringify(Object.fromEntries(Object.entries(results.preset.steps).map(([k, v]) => [k, v.wall_ms])))} ms`);
  } finally { await fresh.close(); }
  // The three lessons, each in a fresh browser (issue 40 item 4), and the
  // training form's refusals.
  results.lessons = await lessons.run({ url: srv.url, shots, check, log });
  // No ../shared/data (run.sh's second dist, MOE_STUDIO_DATA=/nonexistent):
  // the fetched preset (base scratch260K trained from scratch by the CLI on
  // fetched text) walked the same way in a fresh browser; the demo is its
  // base and SmolLM2 the "real model".
  if (process.env.E2E_DIST_NODATA) {
    const srv2 = await serve(process.env.E2E_DIST_NODATA);
    const b2 = await launch(WEBGPU_ARGS);
    try {
      const t2 = Date.now();
      results.fetched_preset = await preset.run({
        context: b2.context, url: srv2.url, dist: process.env.E2E_DIST_NODATA, shots, out, check, log,
        label: 'fetched preset', names: { load: 'load-no-data', router: 'preset-fetched-moerge-router' },
      });
      results.fetched_preset.total_ms = Date.now() - t2;
      log(`fetched preset walk: ${JSON.stringify(Object.fromEntries(Object.entries(results.fetched_preset.steps).map(([k, v]) => [k, v.wall_ms])))} ms`);
      const fetchedCli = JSON.parse(fs.readFileSync(path.join(process.env.E2E_DIST_NODATA, 'demo', 'preset', 'preset.json'), 'utf8'));
      results.fetched_lessons = await lessons.run({
        url: srv2.url, shots, check, log, label: 'fetched', recorded: new Set(fetchedCli.recorded_only || []),
      });
      const page = await b2.context.newPage();
      await page.goto(srv2.url);
      await page.getByTestId('worker-ready').waitFor({ timeout: 60_000 });
      const demo = await page.getByTestId('demo-description').innerText();
      const real = await page.getByTestId('real-description').innerText({ timeout: 30_000 });
      const absent = await page.getByTestId('preset-absent').count();
      check(demo.includes('scratch260K') && real.includes('SmolLM2') && absent === 0,
        `without ../shared/data: the demo model is the fetched preset's base (${demo.slice(0, 60)}), SmolLM2 the real model, no absence notice`);
      await page.close();
    } finally { await b2.close(); await srv2.close(); }
  }
  // A build whose preset could not be made (run.sh's third dist: no
  // ../shared/data and DEMO_FETCH=0): the Load page says why and the demo
  // is SmolLM2.
  if (process.env.E2E_DIST_ABSENT) {
    const srv3 = await serve(process.env.E2E_DIST_ABSENT);
    const b3 = await launch(WEBGPU_ARGS);
    try {
      const page = await b3.context.newPage();
      await page.goto(srv3.url);
      await page.getByTestId('worker-ready').waitFor({ timeout: 60_000 });
      const why = await page.getByTestId('preset-absent').innerText({ timeout: 30_000 });
      const demo = await page.getByTestId('demo-description').innerText();
      const offered = await page.getByTestId('load-preset').count();
      results.no_preset = { notice: why, demo };
      check(why.includes('stories260K is not at /nonexistent') && why.includes('DEMO_FETCH=0') && demo.includes('SmolLM2') && offered === 0,
        `without a preset the Load page says why the teaching demo is absent and offers SmolLM2 (${why.slice(0, 160)}; demo: ${demo.slice(0, 40)})`);
    } finally { await b3.close(); await srv3.close(); }
  }
  fs.writeFileSync(`${out}/results.json`, JSON.stringify(results, null, 2));
  console.log(JSON.stringify(results, null, 2));
  // Without the WebGPU flags the studio must say it falls back to the CPU.
  const plain = await launch([]);
  try {
    const page = await plain.context.newPage();
    await page.goto(srv.url);
    await page.getByTestId('worker-ready').waitFor({ timeout: 60_000 });
    const badge = await page.getByTestId('webgpu').innerText({ timeout: 60_000 });
    check(badge.includes('WebGPU missing'), `without WebGPU flags the header says so (${badge})`);
    await page.getByTestId('tab-graft').click();
    const note = await page.getByTestId('engine-note').filter({ visible: true }).first().innerText();
    check(note.includes('CPU fallback'), `... and the method pages show the CPU fallback notice (${note.slice(0, 80)})`);
  } finally { await plain.close(); }
} catch (e) {
  failures++;
  console.log(`FAIL ${e.stack || e}`);
  const page = browser.context.pages()[0];
  if (page) await page.screenshot({ path: `${out}/failure.png`, fullPage: true }).catch(() => {});
} finally {
  await browser.close();
  await srv.close();
}
console.log(failures ? `${failures} check(s) failed` : 'all checks passed');
process.exit(failures ? 1 : 0);
