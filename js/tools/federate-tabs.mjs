#!/usr/bin/env node
// Open browser clients of a federation (demo/federate.html, served by the relay) in headless system Chromium,
// one tab per URL, and wait until each has heard the federation end; print each tab's report as one JSON line.
//
//   node tools/federate-tabs.mjs URL [URL ...] [--chromium /usr/bin/chromium] [--timeout 600]
//
// A tab whose report says `holding` (its URL asked ?hold=R: round R's result is never sent) is closed there,
// mid-round, as a user closes a tab; its report is the one it had then.

import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';

import { chromium } from 'playwright-core';

/** Flags for headless Chromium on a machine without network access (as tools/browser-run.mjs). */
const CHROMIUM_FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--disable-quic'];

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: { chromium: { type: 'string', default: '/usr/bin/chromium' }, timeout: { type: 'string', default: '600' } },
  });
  if (!positionals.length) throw new TypeError('usage: federate-tabs.mjs URL [URL ...] [--chromium PATH] [--timeout S]');
  const deadline = Date.now() + Number(values.timeout) * 1000;
  const profile = await mkdtemp(join(tmpdir(), 'onnxblocks-chromium-'));
  const context = await chromium.launchPersistentContext(profile, { executablePath: values.chromium, headless: true, args: CHROMIUM_FLAGS });
  /** @type {any[]} */
  const reports = [];
  try {
    const pages = [];
    for (const url of positionals) {
      const page = await context.newPage();
      /** @type {string[]} */
      const errors = [];
      page.on('pageerror', (error) => errors.push(error.message));
      await page.goto(url);
      pages.push({ page, errors, open: true, report: /** @type {any} */ (null) });
    }
    while (pages.some((p) => p.open)) {
      if (Date.now() > deadline) throw new Error(`the tabs did not finish within ${values.timeout} s: ${JSON.stringify(pages.map((p) => p.report?.status))}`);
      for (const tab of pages.filter((p) => p.open)) {
        tab.report = await tab.page.evaluate(() => JSON.parse(JSON.stringify(/** @type {any} */ (window).onnxblocksFederate ?? null)));
        if (tab.report?.holding) {
          await tab.page.close();
          tab.report.closed = true;
          tab.open = false;
        } else if (tab.report && (tab.report.status === 'done' || tab.report.status === 'error')) {
          tab.open = false;
        }
      }
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
    for (const tab of pages) reports.push({ ...tab.report, pageErrors: tab.errors });
  } finally {
    await context.close();
    await rm(profile, { recursive: true, force: true });
  }
  console.log(JSON.stringify({ tabs: reports }));
}

main().catch((error) => {
  console.error(`federate-tabs: ${error instanceof Error ? error.message : String(error)}`);
  process.exitCode = 1;
});
