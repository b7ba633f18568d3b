// Summarises bench/e2e/run.sh's results (JSON lines on stdin, one per run).
//   node table.mjs                 prints the Markdown table and the ratios
//   node table.mjs --peak SYS DUR  prints SYS's peak jobs/s at DUR (the best
//                                  concurrency's median over the closed-loop
//                                  runs) and that concurrency
// Medians over repetitions; the jobs/s cell also shows min-max.
import { readFileSync } from 'node:fs';

const rows = readFileSync(0, 'utf8')
  .split('\n')
  .filter((l) => l.trim())
  .map((l) => JSON.parse(l));

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  if (!s.length) return 0;
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const groupBy = (xs, key) => {
  const m = new Map();
  for (const x of xs) {
    const k = key(x);
    if (!m.has(k)) m.set(k, []);
    m.get(k).push(x);
  }
  return m;
};

const closed = rows.filter((r) => !r.rate);
const peakOf = (sys, dur) => {
  let best = { jps: 0, conc: 0 };
  const g = groupBy(
    closed.filter((r) => r.system === sys && r.durability === dur),
    (r) => r.conns,
  );
  for (const [conc, rs] of g) {
    const jps = median(rs.map((r) => r.jobs_per_s));
    if (jps > best.jps) best = { jps, conc };
  }
  return best;
};

if (process.argv[2] === '--peak') {
  const p = peakOf(process.argv[3], process.argv[4]);
  console.log(`${Math.round(p.jps)} ${p.conc}`);
  process.exit(0);
}

const mb = (kb) => (kb / 1024).toFixed(1);
// Server CPU (user+system, from /proc) per completed job, in microseconds.
const cpuPerJob = (r) => (r.completed ? (r.server_cpu_us || 0) / r.completed : 0);
const fmt = (x) => Math.round(x).toLocaleString('en-US');
const durNames = {
  strict: 'strict (fsync every commit)',
  relaxed: 'relaxed',
};
const durDetail = {
  jackdaw: { strict: '--sync full', relaxed: '--sync normal' },
  'jackdaw-remote': { strict: '--sync full', relaxed: '--sync normal' },
  'jackdaw-wait': { strict: '--sync full', relaxed: '--sync normal' },
  beanstalkd: { strict: '-f 0', relaxed: '-f 50' },
  bullmq: { strict: 'appendfsync always', relaxed: 'appendfsync everysec' },
};
const out = [];
out.push(
  '| system | durability | in flight | jobs/s (median, min-max) | p50 ms | p99 ms | server CPU µs/job | peak RSS server (client) | failed |',
);
out.push('|---|---|---|---|---|---|---|---|---|');
const systems = [...new Set(rows.map((r) => r.system))];
const durs = [...new Set(rows.map((r) => r.durability))];
for (const dur of durs) {
  for (const sys of systems) {
    const g = groupBy(
      closed.filter((r) => r.system === sys && r.durability === dur),
      (r) => r.conns,
    );
    for (const [conc, rs] of [...g].sort((a, b) => a[0] - b[0])) {
      const j = rs.map((r) => r.jobs_per_s);
      const client = rs.some((r) => r.client_rss_kb)
        ? ` (+${mb(Math.max(...rs.map((r) => r.client_rss_kb || 0)))} node)`
        : '';
      out.push(
        `| ${sys} | ${dur}: ${durDetail[sys]?.[dur] ?? ''} | ${conc} | ` +
          `${fmt(median(j))} (${fmt(Math.min(...j))}-${fmt(Math.max(...j))}) | ` +
          `${median(rs.map((r) => r.p50_ms)).toFixed(2)} | ${median(rs.map((r) => r.p99_ms)).toFixed(2)} | ` +
          `${median(rs.map(cpuPerJob)).toFixed(1)} | ` +
          `${mb(Math.max(...rs.map((r) => r.server_rss_kb)))} MB${client} | ` +
          `${rs.reduce((s, r) => s + (r.failed || 0) + (r.jobs - r.completed || 0), 0)} |`,
      );
    }
  }
}
// Jackdaw's CPU per job split by thread name (its layers), closed loop.
const threadRows = closed.filter((r) => r.system === 'jackdaw' && r.server_threads_cpu_us);
if (threadRows.length) {
  const names = [...new Set(threadRows.flatMap((r) => Object.keys(r.server_threads_cpu_us)))].sort();
  out.push('');
  out.push('Jackdaw server CPU µs/job by thread (medians over reps):');
  out.push('');
  out.push(`| durability | in flight | ${names.join(' | ')} |`);
  out.push(`|---|---|${names.map(() => '---').join('|')}|`);
  for (const dur of durs) {
    const g = groupBy(threadRows.filter((r) => r.durability === dur), (r) => r.conns);
    for (const [conc, rs] of [...g].sort((a, b) => a[0] - b[0])) {
      const cells = names.map((n) =>
        median(rs.map((r) => (r.completed ? (r.server_threads_cpu_us[n] || 0) / r.completed : 0))).toFixed(1),
      );
      out.push(`| ${dur} | ${conc} | ${cells.join(' | ')} |`);
    }
  }
}
out.push('');
out.push('Open loop at half of each system\'s own peak (latency from the due time;');
out.push('claim-to-complete for remote workers: the worker\'s, from the claim\'s answer');
out.push('to the complete\'s, and the server\'s histogram bucket holding its p99):');
out.push('');
out.push(
  '| system | durability | offered jobs/s | achieved jobs/s | p50 ms | p99 ms | p99 < 10 ms | ' +
    'claim-to-complete p50 / p99 ms | server histogram p99 | server CPU µs/job |',
);
out.push('|---|---|---|---|---|---|---|---|---|---|');
const le = (ms) => (ms < 0 ? '> 1 h' : `<= ${ms} ms`);
for (const r of rows.filter((x) => x.rate)) {
  const claim =
    r.claim_p99_ms !== undefined ? `${r.claim_p50_ms.toFixed(2)} / ${r.claim_p99_ms.toFixed(2)}` : '';
  const hist = r.server_claim_tasks ? `${le(r.server_claim_p99_le_ms)} (mean ${r.server_claim_mean_ms} ms)` : '';
  out.push(
    `| ${r.system} | ${r.durability} | ${fmt(r.rate)} | ${fmt(r.jobs_per_s)} | ` +
      `${r.p50_ms.toFixed(2)} | ${r.p99_ms.toFixed(2)} | ${r.p99_ms < 10 ? 'yes' : 'no'} | ` +
      `${claim} | ${hist} | ${cpuPerJob(r).toFixed(1)} |`,
  );
}
out.push('');
const inProcess = { jackdaw: 'Jackdaw', 'jackdaw-wait': 'Jackdaw, submit-and-wait' };
for (const dur of durs) {
  let best = { sys: '', jps: 0, conc: 0 };
  for (const sys of systems.filter((s) => !s.startsWith('jackdaw'))) {
    const p = peakOf(sys, dur);
    if (p.jps > best.jps) best = { sys, ...p };
  }
  for (const [sys, name] of Object.entries(inProcess)) {
    const jd = peakOf(sys, dur);
    if (!jd.jps || !best.jps) continue;
    out.push(
      `${durNames[dur] ?? dur}: ${name} peak ${fmt(jd.jps)} jobs/s (${jd.conc} in flight), ` +
        `best peer ${best.sys} ${fmt(best.jps)} jobs/s (${best.conc} in flight): ` +
        `ratio ${(jd.jps / best.jps).toFixed(2)}x`,
    );
  }
}
// Remote workers against beanstalkd, the same put/reserve/delete shape; then
// the ratio of the two runs of each round at the same concurrency (they ran
// next to each other), median over rounds: on a shared machine the drift
// between rounds is larger than the difference being measured.
const goal = { strict: 2, relaxed: 0.5 };
for (const dur of durs) {
  const rw = peakOf('jackdaw-remote', dur);
  const bs = peakOf('beanstalkd', dur);
  if (!rw.jps || !bs.jps) continue;
  out.push(
    `${durNames[dur] ?? dur}: Jackdaw, remote workers ${fmt(rw.jps)} jobs/s (${rw.conc} in flight), ` +
      `beanstalkd ${fmt(bs.jps)} jobs/s (${bs.conc} in flight): ratio ${(rw.jps / bs.jps).toFixed(2)}x`,
  );
  const by = (sys) =>
    new Map(
      closed
        .filter((r) => r.system === sys && r.durability === dur && r.conns === rw.conc && r.round)
        .map((r) => [r.round, r.jobs_per_s]),
    );
  const a = by('jackdaw-remote');
  const b = by('beanstalkd');
  const ratios = [...a].filter(([k]) => b.get(k) > 0).map(([k, v]) => v / b.get(k));
  if (ratios.length) {
    const m = median(ratios);
    out.push(
      `  same-round ratios at ${rw.conc} in flight: ${ratios.map((x) => x.toFixed(2)).join(', ')}; ` +
        `median ${m.toFixed(2)}x (target >= ${goal[dur] ?? '?'}x: ${m >= (goal[dur] ?? Infinity) ? 'met' : 'not met'})`,
    );
  }
}
console.log(out.join('\n'));
