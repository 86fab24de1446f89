// The teaching preset (issue 19 item 3) walked as a teacher would: a fresh
// tab, "Load the teaching demo", then every page with its defaults and one
// click each — Upcycle -> MoErge + router -> Graft -> Neurons -> Inspect ->
// Download. Each step must succeed on the first click within
// E2E_STEP_LIMIT_MS (default 30 s), the DUME table must show oracle < DUME
// < averaging in perplexity on every domain, and the graft
// must lower the ability text's perplexity by at least 30% while every
// domain's rises by at most 15% (the "Must show" of issues 19 and 40). The build's preset comes from scripts/demo_dist.sh
// (scripts/demo_preset.sh; DEMO_STEPS in run.sh); its preset.json (the
// CLI's own numbers on the same models) is printed beside the tab's.
// The same walk runs on the fetched preset of a machine without
// ../shared/data (base scratch260K): `shots` maps each screenshot of the
// walk to its file name (null leaves it out), `label` names the walk.
import fs from 'node:fs';
import path from 'node:path';
import { observeLongTasks, longestTask, longestTasks, longTasksLine, screenshotSpan } from './studio.spec.mjs';

const SHOTS = { load: 'preset-load', router: 'preset-moerge-router', graft: 'preset-graft', inspect: 'preset-inspect' };

export async function run({ context, url, dist, shots, out, check, log, label = 'preset', names = SHOTS }) {
  // 30 s: issue 40's bound per step (the router now scores 3,000 held-out
  // tokens per domain, the preset's held-out documents, so that the tab's
  // DUME table is what preset.json checked: 21 s in the run of 2026-12-03).
  const limit = Number(process.env.E2E_STEP_LIMIT_MS || 30_000);
  const page = await context.newPage();
  await observeLongTasks(page);
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error' && !m.text().includes('404')) pageErrors.push(m.text()); });
  const tid = (id) => page.getByTestId(id);
  const shotSpans = [];
  const shot = async (part) => {
    if (names[part]) await screenshotSpan(page, path.join(shots, `${names[part]}.png`), shotSpans);
  };
  const text = async (id, timeout = 120_000) => { await tid(id).waitFor({ timeout }); return tid(id).innerText(); };
  const tab = async (slug) => { await tid(`tab-${slug}`).click(); await tid(`page-${slug}`).waitFor(); };
  const results = { steps: {} };
  const cli = JSON.parse(fs.readFileSync(path.join(dist, 'demo', 'preset', 'preset.json'), 'utf8'));
  results.cli_preset = cli;
  const recorded = new Set(cli.recorded_only || []);
  const base = cli.base || 'stories260K';
  log(`${label}: preset.json (the CLI, base ${base}${cli.base_steps ? ` trained ${cli.base_steps} steps from scratch` : ''}, DEMO_STEPS=${cli.steps}, built in ${cli.build_seconds} s): ${JSON.stringify(cli.checks)}`);

  await page.goto(url);
  await tid('worker-ready').waitFor({ timeout: 60_000 });
  await text('webgpu', 60_000);
  const from = await page.evaluate(() => performance.now());
  // Where each part of the walk starts on the page's clock (to name the
  // part a long main-thread task fell in).
  const marks = [];
  const mark = async (name) => marks.push([name, await page.evaluate(() => performance.now())]);
  // One click, then the page's own success line (or its error, which fails
  // the step at once with the page's words).
  const step = async (name, button, ok, timeout = 120_000) => {
    await mark(name);
    const t = Date.now();
    const s = await page.evaluate(() => performance.now());
    await tid(button).click();
    const okLoc = tid(ok);
    const err = page.locator('[data-testid$="-error"]').filter({ visible: true });
    await Promise.race([okLoc.waitFor({ timeout }), err.first().waitFor({ timeout })]);
    const wall = Date.now() - t;
    const { longest } = await longestTask(page, s);
    const failed = await err.count() > 0 ? await err.first().innerText() : null;
    const msg = failed ?? await okLoc.innerText();
    results.steps[name] = { wall_ms: wall, longest_task_ms: longest, message: msg };
    check(!failed && wall < limit, `${label}, ${name}: first click succeeds in ${wall} ms (< ${limit} ms; longest main-thread task ${longest} ms): ${msg.slice(0, 140)}`);
    return msg;
  };

  // ---- Load: the teaching demo is the default card.
  const first = await page.locator('.cards .card h3').first().innerText();
  check(first.startsWith(`Teaching demo (${base} experts)`), `${label}, Load: the first card is the teaching demo (${first})`);
  await step('load', 'load-preset', 'load-ok');
  await shot('load');

  await tab('upcycle');
  await tid('param-counts').waitFor();
  await step('upcycle', 'upcycle-run', 'upcycle-ok');

  await tab('moerge');
  await step('moerge', 'moerge-run', 'moerge-ok');
  await step('router', 'route-run', 'route-ok');
  // The DUME table: domain | tokens | DUME | averaging | oracle.
  const rows = await tid('ppl-table').locator('tbody tr').evaluateAll((trs) =>
    trs.map((tr) => [...tr.querySelectorAll('td')].map((td) => td.innerText)));
  results.ppl_table = rows;
  check(rows.length === 3, `${label}: the DUME table has one row per domain (${rows.length})`);
  for (const [domain, , dume, avg, oracle] of rows) {
    const [d, a, o] = [dume, avg, oracle].map(Number);
    const what = `${label}, DUME table, ${domain}: oracle ${o} < DUME ${d} < averaging ${a}`;
    // preset.json `recorded_only`: claims the build records without
    // requiring them (docs/teaching-preset.md, "Measured"): logged here.
    if (recorded.has(`oracle_dume_averaging_${domain}`)) log(`${what}: ${o < d && d < a ? 'holds' : 'does not hold'} (recorded only)`);
    else check(o < d && d < a, what);
  }
  await shot('router');

  await tab('graft');
  await step('graft', 'graft-run', 'graft-ok');
  const pp = await text('graft-ppl-ok', 60_000);
  results.steps.graft.ability = pp;
  const m = /: ([0-9.]+) before the graft -> ([0-9.]+) with it/.exec(pp);
  const drop = m ? 1 - Number(m[2]) / Number(m[1]) : NaN;
  results.graft_ppl = m ? { before: Number(m[1]), after: Number(m[2]), drop } : null;
  check(drop >= 0.30, `${label}: the graft lowers the ability text's perplexity by ${(100 * drop).toFixed(1)}% (>= 30%): ${pp}`);
  // ... and every domain's held-out perplexity rises by at most 15%.
  await tid('graft-domains-summary').waitFor({ timeout: 60_000 });
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="graft-domains"] tbody tr').length >= 3, null, { timeout: 60_000 });
  const drows = await tid('graft-domains').locator('tbody tr').evaluateAll((trs) =>
    trs.map((tr) => [...tr.querySelectorAll('td')].map((td) => td.innerText)));
  results.graft_domains = drows;
  for (const [domain, before, after] of drows) {
    const rise = Number(after) / Number(before) - 1;
    check(rise <= 0.15, `${label}, graft: ${domain} held-out perplexity ${before} -> ${after} (${(100 * rise).toFixed(1)}%, <= +15%)`);
  }
  await shot('graft');

  await tab('neurons');
  await step('neurons', 'neurons-run', 'neurons-ok');

  await tab('inspect');
  await step('inspect', 'inspect-run', 'inspect-tokens');
  // The routed (and grafted) MoE sends the domains' lines to different
  // experts: count each token's first expert (the span's title).
  const experts = await tid('inspect-tokens').locator('.tok').evaluateAll((spans) =>
    spans.map((s) => (/expert (\d+)/.exec(s.title) || [])[1]).filter((e) => e !== undefined));
  const counts = {};
  for (const e of experts) counts[e] = (counts[e] || 0) + 1;
  results.inspect_experts = counts;
  check(Object.keys(counts).length >= 2, `${label}, Inspect: the domains' tokens go to different experts (${JSON.stringify(counts)})`);
  await shot('inspect');

  await tab('download');
  const last = await page.locator('[data-testid^="dl-"][data-testid$="-zip"]').last();
  const t = Date.now();
  const [dl] = await Promise.all([page.waitForEvent('download', { timeout: 60_000 }), last.click()]);
  const p = path.join(out, `${label}-${dl.suggestedFilename()}`);
  await dl.saveAs(p);
  const size = fs.statSync(p).size;
  results.steps.download = { wall_ms: Date.now() - t, file: dl.suggestedFilename(), bytes: size };
  check(size > 100_000 && Date.now() - t < limit, `${label}, download: ${dl.suggestedFilename()} (${size} bytes) in ${Date.now() - t} ms`);
  fs.rmSync(p);

  const { longest } = await longestTask(page, from, shotSpans);
  results.longest_main_thread_task_ms = longest;
  results.longest_main_thread_tasks = await longestTasks(page, from, marks, { screenshot: shotSpans });
  log(`${label} walk, longest main-thread tasks: ${longTasksLine(results.longest_main_thread_tasks)}`);
  check(longest !== null && longest < 100,
    `${label} walk: longest main-thread task ${longest} ms < 100 ms (${shotSpans.length} full-page screenshots left out)`);
  check(pageErrors.length === 0, `${label} walk: no page errors (${pageErrors.slice(0, 3).join(' | ')})`);
  await page.close();
  return results;
}
