#!/usr/bin/env node
// Open the browser demo in headless system Chromium (playwright-core, never a downloaded browser),
// wait until it has trained, print what the page reports as one JSON line, take a screenshot.
//
//   node tools/browser-run.mjs URL [--screenshot FILE] [--state FILE] [--model FILE] [--widths 360,420]
//                              [--chromium /usr/bin/chromium] [--timeout 180] [--adapters DIR]
//
// --adapters clicks the LoRA page's "Download adapters" button and saves its two downloads into DIR;
// --model clicks the page's "Download model" button and saves the download; --widths reports, for each
// viewport width, how many pixels the page overflows horizontally (`overflow`: {width: pixels}).
// Chromium runs with the flags a machine without network access needs (docs/web.md) and a fresh
// --user-data-dir, removed afterwards. Every request that leaves the page's own origin is aborted
// and reported (`offOrigin`): the page must work offline, from the served files.

import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';

import { chromium } from 'playwright-core';

/** Flags for headless Chromium on a machine without network access (docs/web.md). */
export const CHROMIUM_FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--disable-quic',
  // a WebGPU adapter without a GPU: Chromium's SwiftShader (Vulkan on the CPU), for ?ep=webgpu
  '--enable-unsafe-webgpu',
];

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      screenshot: { type: 'string' },
      state: { type: 'string' },
      model: { type: 'string' },
      adapters: { type: 'string' },
      widths: { type: 'string' },
      chromium: { type: 'string', default: '/usr/bin/chromium' },
      timeout: { type: 'string', default: '180' },
    },
  });
  if (positionals.length !== 1) throw new TypeError('usage: browser-run.mjs URL [--screenshot FILE] [--state FILE] [--model FILE] [--widths W,W] [--chromium PATH] [--timeout S]');
  const url = new URL(positionals[0]);
  const timeout = Number(values.timeout) * 1000;
  const profile = await mkdtemp(join(tmpdir(), 'onnxblocks-chromium-'));
  /** @type {string[]} */
  const offOrigin = [];
  /** @type {string[]} */
  const console_ = [];
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: values.chromium,
    headless: true,
    args: CHROMIUM_FLAGS,
    viewport: { width: 1000, height: 580 },
    deviceScaleFactor: 1,
    offline: false,
    acceptDownloads: true,
  });
  try {
    await context.route('**/*', (route) => {
      const target = new URL(route.request().url());
      if (target.origin === url.origin || target.protocol === 'blob:' || target.protocol === 'data:') return route.continue();
      offOrigin.push(target.href);
      return route.abort();
    });
    const page = context.pages()[0] ?? (await context.newPage());
    page.on('console', (message) => {
      if (message.type() === 'error' || message.type() === 'warning') console_.push(`${message.type()}: ${message.text()}`);
    });
    page.on('pageerror', (error) => console_.push(`pageerror: ${error.message}`));
    await page.goto(url.href, { timeout });
    await page.waitForFunction(
      () => {
        const demo = /** @type {any} */ (window).onnxblocksDemo;
        return demo && (demo.status === 'done' || demo.status === 'error');
      },
      undefined,
      { timeout, polling: 100 },
    );
    const report = await page.evaluate(() => {
      const { exportState, ...rest } = /** @type {any} */ (window).onnxblocksDemo;
      return rest;
    });
    if (values.state && report.status === 'done') {
      const encoded = await page.evaluate(() => /** @type {any} */ (window).onnxblocksDemo.exportState());
      await writeFile(values.state, Buffer.from(encoded, 'base64'));
    }
    if (values.model && report.status === 'done') {
      const [download] = await Promise.all([page.waitForEvent('download', { timeout }), page.click('#download-model')]);
      await download.saveAs(values.model);
      report.modelFile = download.suggestedFilename();
    }
    if (values.adapters && report.status === 'done') {
      /** @type {import('playwright-core').Download[]} */
      const downloads = [];
      page.on('download', (download) => downloads.push(download));
      await page.click('#download-adapters');
      const until = Date.now() + timeout;
      while (downloads.length < 2 && Date.now() < until) await new Promise((resolve) => setTimeout(resolve, 100));
      await mkdir(values.adapters, { recursive: true });
      for (const download of downloads) await download.saveAs(join(values.adapters, download.suggestedFilename()));
      report.adapterFiles = downloads.map((download) => download.suggestedFilename()).sort();
    }
    if (values.screenshot) await page.screenshot({ path: values.screenshot, fullPage: true });
    /** @type {Record<string, number>} */
    const overflow = {};
    for (const width of (values.widths ?? '').split(',').filter(Boolean).map(Number)) {
      await page.setViewportSize({ width, height: 800 });
      overflow[width] = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      if (values.screenshot) await page.screenshot({ path: values.screenshot.replace(/\.png$/, `-${width}.png`), fullPage: true });
    }
    const browserVersion = context.browser()?.version() ?? null;
    console.log(JSON.stringify({ ...report, overflow, offOrigin, console: console_, chromium: browserVersion }));
  } finally {
    await context.close();
    await rm(profile, { recursive: true, force: true });
  }
}

main().catch((error) => {
  console.error(`browser-run: ${error instanceof Error ? error.message : String(error)}`);
  process.exitCode = 1;
});
