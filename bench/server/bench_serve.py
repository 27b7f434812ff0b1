#!/usr/bin/env python3
"""Benchmark of a running `spark-agent serve` (not a test), stdlib only: the same method as
bench_serve.mjs, for machines without node (the GPU machine).

  python3 bench/server/bench_serve.py --url http://127.0.0.1:PORT --token TOKEN
          [--tokens 32] [--requests 2] [--clients 1,8,32] [--timeout 60] [--json]

Every client sends --requests streaming chat requests one after another (distinct prompts of
~40 tokens, greedy, ignore_eos so each answer has exactly --tokens tokens, thinking off).
TTFT = request sent -> first content chunk; decode tok/s of a stream = (tokens - 1) / (last
chunk - first chunk); aggregate = all tokens of a level / its wall time.
"""
import argparse
import http.client
import json
import sys
import threading
import time
import urllib.parse

WORDS = ['river', 'lamp', 'orbit', 'cedar', 'piano', 'harbor', 'quartz', 'meadow', 'signal',
         'ember', 'canyon', 'violet']


def messages(i):
    w = [WORDS[(i * 7 + k * 5) % len(WORDS)] for k in range(24)]
    return [{'role': 'user', 'content': f'Request {i}: write about {" ".join(w)}.'}]


def one(url, token, tokens, i, timeout):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    body = json.dumps({'model': 'bench', 'messages': messages(i), 'max_tokens': tokens,
                       'temperature': 0, 'ignore_eos': True, 'stream': True,
                       'stream_options': {'include_usage': True},
                       'chat_template_kwargs': {'enable_thinking': False}})
    t0 = time.perf_counter()
    conn.request('POST', '/v1/chat/completions', body=body,
                 headers={'authorization': f'Bearer {token}',
                          'content-type': 'application/json'})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f'HTTP {r.status}: {r.read()[:300]!r}')
    first = last = 0.0
    n_tok = cached = 0
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b'data: ') or line == b'data: [DONE]':
            continue
        j = json.loads(line[6:])
        if j.get('usage'):
            n_tok = j['usage']['completion_tokens']
            cached = j['usage'].get('prompt_tokens_details', {}).get('cached_tokens', 0)
        ch = j.get('choices') or []
        d = ch[0].get('delta') if ch else None
        if d and (d.get('content') or d.get('reasoning_content')):
            now = time.perf_counter()
            if not first:
                first = now
            last = now
    conn.close()
    tps = (n_tok - 1) / (last - first) if n_tok > 1 and last > first else 0.0
    return {'ttft': (first - t0) * 1e3 if first else float('nan'), 'tps': tps,
            'tokens': n_tok, 'cached': cached}


def pct(xs, p):
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--url', required=True)
    ap.add_argument('--token', required=True)
    ap.add_argument('--tokens', type=int, default=32)
    ap.add_argument('--requests', type=int, default=2)
    ap.add_argument('--clients', default='1,8,32')
    ap.add_argument('--timeout', type=float, default=60)
    ap.add_argument('--json', action='store_true')
    a = ap.parse_args()
    results = []
    n = 0
    for c in [int(x) for x in a.clients.split(',')]:
        out = [[] for _ in range(c)]
        errs = []

        def client(k, c=c, out=out, errs=errs, base=n):
            try:
                for r in range(a.requests):
                    out[k].append(one(a.url, a.token, a.tokens,
                                      1000 * c + a.requests * k + r + base, a.timeout))
            except Exception as e:  # reported with the level, the level still prints
                errs.append(repr(e))

        t0 = time.perf_counter()
        th = [threading.Thread(target=client, args=(k,)) for k in range(c)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.perf_counter() - t0
        n += c * a.requests
        flat = [x for o in out for x in o]
        if not flat:
            print(f'clients {c}: every request failed: {errs[:3]}', flush=True)
            continue
        row = {'clients': c, 'requests': len(flat), 'errors': len(errs),
               'tokens_each': a.tokens,
               'ttft_ms_p50': pct([x['ttft'] for x in flat], 50),
               'ttft_ms_p99': pct([x['ttft'] for x in flat], 99),
               'stream_tok_s_p50': pct([x['tps'] for x in flat], 50),
               'stream_tok_s_p1': pct([x['tps'] for x in flat], 1),
               'aggregate_tok_s': sum(x['tokens'] for x in flat) / wall, 'wall_s': wall}
        results.append(row)
        if not a.json:
            print(f"clients {c:2d}: TTFT p50 {row['ttft_ms_p50']:.0f} ms, p99 "
                  f"{row['ttft_ms_p99']:.0f} ms; per-stream decode p50 "
                  f"{row['stream_tok_s_p50']:.1f} tok/s (slowest 1%: "
                  f"{row['stream_tok_s_p1']:.1f}); aggregate {row['aggregate_tok_s']:.1f} tok/s "
                  f"over {row['requests']} requests in {wall:.1f} s"
                  + (f"; {len(errs)} errors: {errs[:2]}" if errs else ''), flush=True)
    if a.json:
        print(json.dumps({'url': a.url, 'tokens': a.tokens, 'results': results}, indent=1))
    return 0 if results else 1


if __name__ == '__main__':
    sys.exit(main())
