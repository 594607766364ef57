// Drives a served Jaeger UI build in headless Chromium the way a person would, and prints
// what the page shows as one JSON object on stdout (jaeger_ui_check.py judges it).
//
// For each job (a trace id and two PNG paths), in a fresh page of one browser:
//   /search -> "Upload" tab -> file input <- EXPORT
//   -> the result item linking to /trace/TRACE_ID -> click -> trace page
//   -> screenshot (timeline as first drawn) -> for each span row: open its detail,
//      open its Events/Logs accordion, read the detail's text, close it again
//   -> the row carrying chaos.fault (else the first error row) opened -> second screenshot
//
// Rows are read one at a time with every other detail closed: the timeline is a virtual
// list, so rows far below the fold are not in the DOM while many details are open.
//
// usage: node jaeger_ui_drive.cjs URL EXPORT '[{"traceId": ID, "timeline": PNG, "detail": PNG}, ...]'
// prints a JSON list: per job {traceId, results (traces listed), header, rows}
// env:   FAULTLAB_PLAYWRIGHT_CORE (the playwright-core package dir), FAULTLAB_CHROMIUM (binary)
'use strict';

const { chromium } = require(process.env.FAULTLAB_PLAYWRIGHT_CORE);

const MAX_ROWS = 60;

async function upload(page, url, exportPath, traceId) {
  await page.goto(`${url}/search`);
  await page.getByRole('tab', { name: 'Upload' }).click();
  await page.setInputFiles('input[type=file]', exportPath);
  const link = page.locator(`a[href*="/trace/${traceId}"]`).first();
  await link.waitFor();
  const results = await page.locator('.ResultItem').count();
  await link.click();
  await page.locator('.span-row').first().waitFor();
  return results;
}

// Opens a detail's Events/Logs accordion (open by default in 2.19: a click would close it)
// with "show all" (events outside the view range are hidden otherwise) and "show more..."
// (past 3 events); returns its title.
async function openEvents(detail) {
  const header = detail.locator('.AccordionEvents--header').first();
  if ((await header.count()) === 0) return null;
  const isOpen = async () => (await header.getAttribute('aria-checked')) === 'true';
  if (!(await isOpen())) await header.click();
  const title = (await header.locator('strong').innerText()).trim();
  const all = header.locator('button', { hasText: 'show all' });
  if ((await all.count()) > 0) {
    await all.first().click();
    if (!(await isOpen())) await header.click(); // the button's click reaches the header too
  }
  const more = detail.locator('.AccordionEvents--content button', { hasText: 'show more' });
  if ((await more.count()) > 0) await more.first().click();
  return title;
}

async function readRow(page, i) {
  const row = page.locator('.span-row').nth(i);
  await row.scrollIntoViewIfNeeded();
  const svc = row.locator('.span-svc-name');
  const fact = {
    service: (await svc.innerText()).trim(),
    name: (await row.locator('.endpoint-name').innerText()).trim(),
    ownError: (await svc.locator('.SpanBarRow--errorIcon:not(.SpanBarRow--errorIcon--hollow)').count()) > 0,
    color: await row.locator('.span-name').evaluate(el => getComputedStyle(el).borderLeftColor),
  };
  await row.locator('.span-name').click();
  const detail = page.locator('.detail-row').first();
  await detail.waitFor();
  fact.events = await openEvents(detail);
  fact.eventNames = await detail
    .locator('.AccordionEvents--content .AccordionAttributes--summaryItem')
    .evaluateAll(items => items
      .filter(li => li.querySelector('.AccordionAttributes--summaryLabel')?.textContent === 'event')
      .map(li => li.textContent.replace(/^event=/, '')));
  fact.detail = await detail.innerText();
  const id = /([0-9a-f]{16})/.exec(await detail.locator('.SpanDetail--debugInfo').innerText());
  fact.spanID = id ? id[1] : null;
  await row.locator('.span-name').click();
  await detail.waitFor({ state: 'detached' });
  return fact;
}

// The row a reader opens first: the one carrying the fault, else the first error.
async function openStoryRow(page, rows) {
  let i = rows.findIndex(r => r.detail.includes('chaos.fault'));
  if (i < 0) i = rows.findIndex(r => r.ownError);
  if (i < 0) return;
  const row = page.locator('.span-row').nth(i);
  await row.locator('.span-name').click();
  await openEvents(page.locator('.detail-row').first());
}

async function checkTrace(browser, url, exportPath, job) {
  const page = await browser.newPage({ viewport: { width: 1440, height: 720 } });
  try {
    page.setDefaultTimeout(30000);
    const results = await upload(page, url, exportPath, job.traceId);
    const header = await page.locator('.TracePageHeader').first().innerText().catch(() => '');
    await page.mouse.move(0, 0); // no hover label left over from the click
    await page.screenshot({ path: job.timeline, fullPage: true });
    const count = Math.min(await page.locator('.span-row').count(), MAX_ROWS);
    const rows = [];
    for (let i = 0; i < count; i++) rows.push(await readRow(page, i));
    await openStoryRow(page, rows);
    await page.mouse.move(0, 0);
    await page.screenshot({ path: job.detail, fullPage: true });
    return { traceId: job.traceId, results, header, rows };
  } finally {
    await page.close();
  }
}

async function main() {
  const [url, exportPath, jobsJson] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath: process.env.FAULTLAB_CHROMIUM,
    args: ['--no-sandbox', '--disable-dev-shm-usage'],
  });
  try {
    const seen = [];
    for (const job of JSON.parse(jobsJson)) seen.push(await checkTrace(browser, url, exportPath, job));
    process.stdout.write(JSON.stringify(seen) + '\n');
  } finally {
    await browser.close();
  }
}

main().catch(err => {
  process.stderr.write(`jaeger_ui_drive: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
