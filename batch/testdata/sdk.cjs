// Drives `kvgate batch` with the official OpenAI SDK, as a user would:
// files.create -> batches.create -> batches.retrieve until the batch ends
// -> files.content of the output and error files. The Go e2e tests run it
// and check what it wrote.
//
//   node sdk.cjs MODE BASE_URL INPUT.jsonl OUT_DIR WINDOW [CANCEL_AFTER]
//
// MODE run: wait for the end. MODE cancel: cancel once CANCEL_AFTER lines
// have completed. OUT_DIR receives batch_id (as soon as it exists),
// statuses (each status seen, in order), batch.json (the final object),
// output.jsonl and error.jsonl (when the batch has them), list.json.
'use strict';
const fs = require('fs');
const path = require('path');
const OpenAI = require('openai');

const [mode, baseURL, input, out, windowArg, cancelAfterArg] = process.argv.slice(2);
const tenant = process.env.KVGATE_BATCH_TENANT || 'tenant-e2e';
const client = new OpenAI({
  apiKey: 'unused', baseURL, maxRetries: 8, timeout: 30000,
  defaultHeaders: { 'X-MaaS-Username': tenant },
});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const finalStatuses = new Set(['completed', 'failed', 'expired', 'cancelled']);

// While the test kills the server, calls fail; a user's poll loop retries.
async function patient(fn) {
  for (let i = 0; ; i++) {
    try {
      return await fn();
    } catch (e) {
      if (i >= 600 || (e.status && e.status < 500)) throw e;
      await sleep(100);
    }
  }
}

async function main() {
  const file = await patient(() => client.files.create({ file: fs.createReadStream(input), purpose: 'batch' }));
  if (file.object !== 'file' || file.purpose !== 'batch') throw new Error('bad file object ' + JSON.stringify(file));
  let batch = await patient(() => client.batches.create({
    input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: windowArg,
    metadata: { suite: 'kvgate-e2e' }, output_expires_after: { anchor: 'created_at', seconds: 7200 },
  }));
  fs.writeFileSync(path.join(out, 'batch_id'), batch.id);
  const statuses = [batch.status];
  const cancelAfter = Number(cancelAfterArg || 0);
  let cancelled = false;
  while (!finalStatuses.has(batch.status)) {
    await sleep(100);
    batch = await patient(() => client.batches.retrieve(batch.id));
    if (statuses[statuses.length - 1] !== batch.status) statuses.push(batch.status);
    if (mode === 'cancel' && !cancelled && batch.request_counts.completed >= cancelAfter) {
      const c = await patient(() => client.batches.cancel(batch.id));
      cancelled = true;
      if (statuses[statuses.length - 1] !== c.status) statuses.push(c.status);
    }
  }
  fs.writeFileSync(path.join(out, 'statuses'), statuses.join('\n') + '\n');
  fs.writeFileSync(path.join(out, 'batch.json'), JSON.stringify(batch));
  for (const [id, name] of [[batch.output_file_id, 'output.jsonl'], [batch.error_file_id, 'error.jsonl']]) {
    if (!id) continue;
    const meta = await patient(() => client.files.retrieve(id));
    if (meta.purpose !== 'batch_output') throw new Error('result file purpose ' + meta.purpose);
    const resp = await patient(() => client.files.content(id));
    fs.writeFileSync(path.join(out, name), await resp.text());
  }
  const ids = [];
  for await (const b of client.batches.list({ limit: 2 })) ids.push(b.id);
  fs.writeFileSync(path.join(out, 'list.json'), JSON.stringify(ids));
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
