// The three lessons (issue 40 item 4) walked as a student would: each in a
// fresh tab of a fresh browser profile, every step's button clicked once
// with its defaults. A step succeeds when its "what to notice" sentence
// appears (it is written from the step's finished results); it fails at
// once when an error line shows. Each step must take at most
// E2E_LESSON_STEP_MS (default 30 s), no main-thread task may reach 100 ms,
// no page error. Screenshots: lesson-<paper>.png. Then the numbers the
// issue asks of the lessons' steps:
//   - DeltaMoE stage 1 lowers the new language's (hu) held-out perplexity
//     and raises the new experts' routing share of it;
//   - the training form refuses bad input next to its field (an empty
//     text, a learning rate of 0 or NaN, a dense model), before any work.
import path from 'node:path';
import { observeLongTasks, longestTask, longestTasks, longTasksLine, screenshotSpan } from './studio.spec.mjs';
import { launch, WEBGPU_ARGS } from './browser.mjs';

const LESSONS = [
  { slug: 'learn-dume', steps: [2, 3], shot: 'lesson-dume' },
  { slug: 'learn-deltamoe', steps: [2, 3, 4, 5], shot: 'lesson-deltamoe' },
  { slug: 'learn-neuronmoe', steps: [2, 3, 4, 5], shot: 'lesson-neuronmoe' },
];

/** Reads a table's body as text cells. */
async function cells(loc) {
  return loc.locator('tbody tr').evaluateAll((trs) => trs.map((tr) => [...tr.querySelectorAll('td')].map((td) => td.innerText)));
}

async function walk({ url, slug, steps, shot, shots, check, log, label, recorded = new Set() }) {
  const limit = Number(process.env.E2E_LESSON_STEP_MS || 30_000);
  const browser = await launch(WEBGPU_ARGS);
  const results = { steps: {} };
  try {
    const page = await browser.context.newPage();
    await observeLongTasks(page);
    const pageErrors = [];
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    page.on('console', (m) => { if (m.type() === 'error' && !m.text().includes('404')) pageErrors.push(m.text()); });
    const tid = (id) => page.getByTestId(id);
    await page.goto(`${url}#${slug}`);
    await tid('worker-ready').waitFor({ timeout: 60_000 });
    await tid('webgpu').waitFor({ timeout: 60_000 });
    await tid(`page-${slug}`).waitFor();
    const from = await page.evaluate(() => performance.now());
    const step = async (n) => {
      const run = tid(`${slug}-${n}-run`);
      await run.waitFor({ timeout: 10_000 });
      const t = Date.now();
      const s = await page.evaluate(() => performance.now());
      await run.click();
      const notice = tid(`${slug}-${n}-notice`);
      const err = page.locator(`[data-testid^="${slug}-${n}"][data-testid*="-error"]`).filter({ visible: true });
      await Promise.race([notice.waitFor({ timeout: 300_000 }), err.first().waitFor({ timeout: 300_000 })]);
      const wall = Date.now() - t;
      const { longest } = await longestTask(page, s);
      const failed = (await err.count()) > 0 ? await err.first().innerText() : null;
      const msg = failed ?? (await notice.innerText());
      results.steps[n] = { wall_ms: wall, longest_task_ms: longest, notice: msg };
      check(!failed && wall <= limit,
        `${label} ${slug}, step ${n}: first click succeeds in ${wall} ms (<= ${limit}; longest main-thread task ${longest} ms): ${msg.slice(0, 160)}`);
      return msg;
    };
    await step(1);
    for (const n of steps) await step(n);
    if (slug === 'learn-dume') {
      const rows = await cells(tid('ppl-table'));
      results.ppl_table = rows;
      for (const [domain, , dume, avg, oracle] of rows) {
        const [d, a, o] = [dume, avg, oracle].map(Number);
        const what = `${label} DUME lesson, ${domain}: oracle ${o} < DUME ${d} < averaging ${a}`;
        // A claim the preset records without requiring it (preset.json
        // `recorded_only`, docs/teaching-preset.md) is logged, not asserted.
        if (recorded.has(`oracle_dume_averaging_${domain}`)) log(`${what}: ${o < d && d < a ? 'holds' : 'does not hold'} (recorded only)`);
        else check(o < d && d < a, what);
      }
    }
    if (slug === 'learn-deltamoe') {
      const rows = await cells(tid(`${slug}-3-table`));
      results.stage1 = rows;
      const hu = rows.find((r) => r[0] === 'hu');
      const [p0, p1, , s0, s1] = hu.slice(1).map((x) => Number(String(x).replace('%', '')));
      check(p1 < p0 && s1 > s0, `${label} DeltaMoE stage 1 in the tab: hu held-out perplexity ${p0} -> ${p1}, new experts' share of hu ${s0} -> ${s1}`);
      results.graft = await cells(tid(`${slug}-5-table`));
    }
    if (slug === 'learn-neuronmoe') results.compare = await cells(tid(`${slug}-compare`));
    const shotSpans = [];
    await screenshotSpan(page, path.join(shots, `${shot}${label === 'fetched' ? '-fetched' : ''}.png`), shotSpans);
    const { longest } = await longestTask(page, from, shotSpans);
    results.longest_main_thread_task_ms = longest;
    if (longest === null || longest >= 100) {
      log(`${label} ${slug}, longest main-thread tasks: ${longTasksLine(await longestTasks(page, from, [['the lesson', from]], { screenshot: shotSpans }))}`);
    }
    check(longest !== null && longest < 100, `${label} ${slug}: longest main-thread task ${longest} ms < 100 ms (the screenshot left out)`);
    check(pageErrors.length === 0, `${label} ${slug}: no page errors (${pageErrors.slice(0, 3).join(' | ')})`);
  } finally {
    await browser.close();
  }
  return results;
}

/** The training form's refusals, on the Train page of a fresh tab. */
async function badInput({ url, check, label }) {
  const browser = await launch(WEBGPU_ARGS);
  const results = {};
  try {
    const page = await browser.context.newPage();
    const tid = (id) => page.getByTestId(id);
    await page.goto(`${url}#load`);
    await tid('worker-ready').waitFor({ timeout: 60_000 });
    await tid('load-preset').click();
    await tid('load-ok').waitFor({ timeout: 60_000 });
    // A dense model for stage 1 (nothing upcycled yet: the newest model is dense).
    await tid('tab-train').click();
    const sel = tid('train-model');
    const dense = await sel.locator('option').first().getAttribute('value');
    await sel.selectOption(dense);
    const model = await tid('train-error-model').innerText({ timeout: 5_000 });
    const disabled = await tid('train-run').isDisabled();
    check(model.includes('dense') && disabled, `${label} train form: a dense model for stage 1 is refused next to the field, button off (${model})`);
    results.dense = model;
    // Upcycle, then bad numbers and texts on the MoE.
    await tid('tab-upcycle').click();
    await tid('upcycle-run').click();
    await tid('upcycle-ok').waitFor({ timeout: 60_000 });
    await tid('tab-train').click();
    for (const [value, want] of [['0', 'out of range'], ['NaN', 'out of range'], ['abc', 'not a valid number']]) {
      await tid('train-lr').fill(value);
      const e = await tid('train-error-lr').innerText({ timeout: 5_000 });
      check(e.includes(want) && (await tid('train-run').isDisabled()), `${label} train form: learning rate ${value} refused next to the field (${e})`);
      results[`lr_${value}`] = e;
    }
    await tid('train-lr').fill('0.003');
    await page.locator('[data-testid="train-new-summary"]').click();
    await tid('train-new-train').fill('   \n  ');
    const t = await tid('train-error-new-text').innerText({ timeout: 5_000 });
    check(t.includes('empty') && (await tid('train-run').isDisabled()), `${label} train form: an empty text refused next to the field (${t})`);
    results.empty_text = t;
    // A text of a few tokens: refused by the worker (too short for one
    // sequence), next to the field, and nothing is made.
    await tid('train-new-train').fill('szia');
    const before = await page.locator('[data-testid="made-models"] tbody tr').count();
    await tid('train-run').click();
    const w = await tid('train-error-new-text').innerText({ timeout: 60_000 });
    await tid('tab-load').click();
    const after = await page.locator('[data-testid="made-models"] tbody tr').count();
    check(w.includes('tokens') && after === before, `${label} train form: a text with too few tokens is refused by the worker next to the field, nothing made (${w})`);
    results.short_text = w;
  } finally {
    await browser.close();
  }
  return results;
}

/**
 * Walks every lesson; `recorded` names the preset.json checks the build
 * records without requiring (its `recorded_only`).
 */
export async function run({ url, shots, check, log, label = 'preset', only = null, recorded = new Set() }) {
  const results = {};
  for (const l of LESSONS.filter((x) => !only || x.slug === only)) {
    results[l.slug] = await walk({ url, ...l, shots, check, log, label, recorded });
    log(`${label} ${l.slug}: ${JSON.stringify(Object.fromEntries(Object.entries(results[l.slug].steps).map(([k, v]) => [k, v.wall_ms])))} ms`);
  }
  if (!only || only === 'bad-input') results.bad_input = await badInput({ url, check, label });
  return results;
}
