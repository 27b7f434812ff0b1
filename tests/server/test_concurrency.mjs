// Many clients on one scheduler: N (32) concurrent streamed chats (the `openai` SDK) on the tiny
// model finish with exactly the text of the same requests run alone (greedy); a client that
// disconnects mid-stream has its request cancelled and its KV blocks freed (seen in /metrics);
// SIGTERM lets running streams finish, refuses new work, and exits 0; with a short drain
// timeout a long generation is cancelled instead.
import OpenAI from 'openai';
import { startServer, checker, metric, req, sleep } from './serve_util.mjs';

const { check, failures } = checker();
// SPARK_TEST_STREAMS / SPARK_TEST_TOKENS: the ctest rows run 8 x 4 (integration, quick also
// under ASan) and 32 x 12 (slow).
const N = Number(process.env.SPARK_TEST_STREAMS || 32);
const MAX = Number(process.env.SPARK_TEST_TOKENS || 12);
const srv = await startServer({ tag: 'concurrency', args: ['--max-seqs', String(Math.max(N, 4)),
  '--max-conns', String(2 * N + 16)] });
const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: srv.token, maxRetries: 0 });
const topics = ['rivers', 'bridges', 'compilers', 'owls', 'tea', 'glaciers', 'chess', 'radio'];
const prompt = (i) => [{ role: 'user', content: `Request ${i}: tell me about ${topics[i % 8]}` +
  (i % 3 ? '.' : ' in one line, please.') }];
const params = (i) => ({ model: 'tiny', messages: prompt(i), max_tokens: MAX, temperature: 0,
  chat_template_kwargs: { enable_thinking: false } });

async function streamed(i, signal) {
  const s = await client.chat.completions.create({ ...params(i), stream: true }, { signal });
  let text = '';
  for await (const ch of s) text += ch.choices[0]?.delta?.content ?? '';
  return text;
}

try {
  // alone, one after another
  const solo = [];
  for (let i = 0; i < N; i++) {
    const r = await client.chat.completions.create(params(i));
    solo.push(r.choices[0].message.content);
  }
  check(new Set(solo).size > N / 4, 'the prompts give different texts');
  // all at once
  const t0 = Date.now();
  const together = await Promise.all(Array.from({ length: N }, (_, i) => streamed(i)));
  const ms = Date.now() - t0;
  let same = 0;
  for (let i = 0; i < N; i++) {
    if (together[i] === solo[i]) same++;
    else console.error(`request ${i}: alone ${JSON.stringify(solo[i])} together ` +
      JSON.stringify(together[i]));
  }
  check(same === N, `${N} concurrent streams identical to solo runs (${same}/${N}, ${ms} ms)`);
  console.log(`${N} concurrent streams of ${MAX} tokens: ${ms} ms`);
  const gen0 = await metric(srv, 'spark_generated_tokens_total');
  const itl = await metric(srv, 'spark_inter_token_latency_seconds_count');
  // one gap per streamed token after the first (a sampled end-of-turn token is counted in
  // the generated tokens but streams nothing)
  check(itl > 0 && itl <= gen0 - 2 * N && itl >= gen0 - 4 * N, `per-token histogram: one gap ` +
    `per token after the first (${itl} vs ${gen0} tokens in ${2 * N} generations)`);
  const steps = await metric(srv, 'spark_engine_steps_total');
  check(steps > 0, 'engine steps counted');
  check((await metric(srv, 'spark_requests_running')) === 0 &&
    (await metric(srv, 'spark_jobs_active')) === 0, 'nothing running after the batch');

  // disconnect mid-stream: cancelled, blocks freed
  const used0 = await metric(srv, 'spark_kv_blocks_used');
  const canceled0 = await metric(srv, 'spark_generations_total{finish="canceled"}');
  const ac = new AbortController();
  const long = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time',
    max_tokens: 4000, temperature: 0.8, seed: 1, stream: true, ignore_eos: true },
  { signal: ac.signal });
  let got = 0;
  let runningSeen = 0, usedSeen = 0;
  try {
    for await (const ch of long) {
      got += (ch.choices[0]?.text ?? '').length;
      if (got > 0 && !ac.signal.aborted) {
        // the scheduler publishes its figures after each step: wait for the step to end
        for (let k = 0; k < 100 && runningSeen !== 1; k++) {
          runningSeen = await metric(srv, 'spark_requests_running');
          if (runningSeen !== 1) await sleep(20);
        }
        usedSeen = await metric(srv, 'spark_kv_blocks_used');
        ac.abort();
      }
    }
  } catch (e) {
    check(e.name === 'APIUserAbortError' || /abort/i.test(String(e)), 'abort: ' + e);
  }
  check(runningSeen === 1 && usedSeen > used0,
    `while streaming: 1 running (${runningSeen}), blocks in use (${usedSeen} > ${used0})`);
  let freed = false;
  for (let i = 0; i < 50 && !freed; i++) {
    await sleep(100);
    freed = (await metric(srv, 'spark_requests_running')) === 0 &&
      (await metric(srv, 'spark_kv_blocks_used')) <= used0 &&
      (await metric(srv, 'spark_generations_total{finish="canceled"}')) === canceled0 + 1;
  }
  check(freed, 'disconnect: request cancelled and its blocks freed within 5 s');
  const gen = await metric(srv, 'spark_generated_tokens_total');
  await sleep(500);
  check((await metric(srv, 'spark_generated_tokens_total')) === gen, 'no tokens after cancel');
  const r = await req(srv, '/health');
  check(r.status === 200, 'still serving after the disconnect');
} catch (e) {
  check(false, 'unexpected: ' + (e.stack || e));
}

// SIGTERM: a running stream completes, new work gets 503, exit 0
try {
  const p = streamed(1);
  await sleep(50);
  srv.proc.kill('SIGTERM');
  const text = await p;
  check(text.length > 0, 'drain: the running stream completed');
  const late = await req(srv, '/v1/chat/completions', { method: 'POST', body: params(2) })
    .catch(() => ({ status: 'refused' }));
  check(late.status === 503 || late.status === 'refused', 'drain: new work refused (' + late.status + ')');
} catch (e) {
  check(false, 'drain: ' + (e.stack || e));
}
const code = await srv.stop();
check(code === 0, 'drain: exit 0 (' + code + ')');

// a short drain timeout cancels a long generation
{
  const s2 = await startServer({ tag: 'drain', args: ['--drain-timeout', '1'] });
  const c2 = new OpenAI({ baseURL: s2.url + '/v1', apiKey: s2.token, maxRetries: 0 });
  const st = await c2.completions.create({ model: 'tiny', prompt: 'Once', max_tokens: 100000,
    temperature: 1, seed: 3, stream: true, ignore_eos: true });
  const t0 = Date.now();
  let first = false;
  let finish = null;
  try {
    for await (const ch of st) {
      if (!first) { first = true; s2.proc.kill('SIGTERM'); }
      if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
    }
  } catch (e) {
    finish = 'error: ' + e;
  }
  const c = await s2.stop();
  const ms = Date.now() - t0;
  check(c === 0 && ms < 8000, `short drain: cancelled and exited 0 in ${ms} ms (${c}, ${finish})`);
}

if (failures()) process.exit(1);
console.log('test_concurrency: ok');
