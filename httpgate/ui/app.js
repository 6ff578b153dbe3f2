// sluice live page. Reads /v1/stats every two seconds and draws it.
//
// Every value from the server is set with textContent or as an SVG
// number, never parsed as HTML: keys are whatever clients sent.
'use strict';

(() => {
  const REFRESH_MS = 2000;
  const SVG = 'http://www.w3.org/2000/svg';
  const $ = (id) => document.getElementById(id);

  // el builds an element: attrs are set as attributes, children are
  // nodes or strings (as text).
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null && v !== false) e.setAttribute(k, String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      e.append(typeof c === 'string' || typeof c === 'number' ? document.createTextNode(String(c)) : c);
    }
    return e;
  }

  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }

  const sum = (xs) => (xs || []).reduce((a, b) => a + b, 0);
  const last = (xs) => (xs && xs.length ? xs[xs.length - 1] : 0);

  function num(n) {
    if (n === null || n === undefined) return '–';
    const a = Math.abs(n);
    if (a >= 1e9) return (n / 1e9).toFixed(1) + 'G';
    if (a >= 1e6) return (n / 1e6).toFixed(1) + 'M';
    if (a >= 1e4) return (n / 1e3).toFixed(1) + 'k';
    if (Number.isInteger(n)) return String(n);
    return String(Math.round(n * 100) / 100);
  }

  function dur(seconds) {
    if (seconds >= 86400 && seconds % 86400 === 0) return seconds / 86400 + 'd';
    if (seconds >= 3600 && seconds % 3600 === 0) return seconds / 3600 + 'h';
    if (seconds >= 60 && seconds % 60 === 0) return seconds / 60 + 'm';
    return num(seconds) + 's';
  }

  function ms(v) {
    if (v === null || v === undefined) return '–';
    if (v === 0) return 'now';
    if (v < 1000) return v + 'ms';
    if (v < 60000) return (v / 1000).toFixed(1) + 's';
    const s = Math.ceil(v / 1000);
    if (s < 3600) return Math.floor(s / 60) + 'm' + (s % 60 ? ' ' + (s % 60) + 's' : '');
    return Math.floor(s / 3600) + 'h' + (s % 3600 >= 60 ? ' ' + Math.floor((s % 3600) / 60) + 'm' : '');
  }

  function clock(iso) {
    if (!iso || iso.startsWith('0001-')) return '–';
    return new Date(iso).toLocaleTimeString([], { hour12: false });
  }

  // rate says what a limit allows, in the terms of the config.
  function rate(l) {
    if (l.window_s) return num(l.capacity) + ' per ' + dur(l.window_s);
    // A slow rate in the unit that shows it as a number: 10/h, not 0/s.
    let r = l.rate_per_second, unit = '/s';
    if (r < 1) { r *= 60; unit = '/min'; }
    if (r < 1) { r *= 60; unit = '/h'; }
    if (r < 1) { r *= 24; unit = '/day'; }
    return num(Math.round(r * 1000) / 1000) + unit + ', burst ' + num(l.capacity);
  }

  // chart draws series ([{values, cls}]) over the window as lines, on
  // axes with their scales: the value axis from 0 (bottom) to the largest
  // value (top), the time axis from five minutes ago to now, and the
  // series' smallest and largest values beneath (as HTML: the SVG
  // stretches to the width, and would stretch text with it).
  function chart(series, label, unit) {
    const W = 300, H = 40;
    const s = svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'aria-label': label, preserveAspectRatio: 'none' });
    let peak = 0, low = null;
    for (const x of series) {
      for (const v of x.values || []) {
        peak = Math.max(peak, v);
        low = low === null ? v : Math.min(low, v);
      }
    }
    if (low === null) low = 0;
    const scale = peak > 0 ? peak : 1;
    s.append(svg('line', { x1: 0, x2: W, y1: H - 0.5, y2: H - 0.5, class: 'grid' }));
    s.append(svg('line', { x1: 0, x2: W, y1: H / 2, y2: H / 2, class: 'grid' }));
    s.append(svg('line', { x1: 0, x2: W, y1: 0.5, y2: 0.5, class: 'grid' }));
    for (const x of series) {
      const vs = x.values;
      if (!vs || !vs.length) continue;
      const step = W / Math.max(vs.length - 1, 1);
      const pts = vs.map((v, i) => `${(i * step).toFixed(1)},${(H - 1 - (v / scale) * (H - 2)).toFixed(1)}`);
      if (x.area) s.append(svg('polygon', { points: `0,${H} ${pts.join(' ')} ${W},${H}`, class: x.cls + '-area' }));
      s.append(svg('polyline', { points: pts.join(' '), class: x.cls, 'vector-effect': 'non-scaling-stroke' }));
    }
    const t = svg('title', {});
    t.textContent = label;
    s.append(t);
    const u = unit || '';
    return el('figure', { class: 'chartbox' },
      el('div', { class: 'yaxis' },
        el('span', { 'data-axis': 'max', 'data-value': scale }, num(scale) + u),
        el('span', {}, num(scale / 2)),
        el('span', { 'data-axis': 'min', 'data-value': 0 }, '0')),
      s,
      el('div', { class: 'axis' }, el('span', {}, '−5 min'), el('span', {}, '−2.5 min'), el('span', {}, 'now')),
      el('div', { class: 'range' }, `min ${num(low)}${u} · max ${num(peak)}${u}`));
  }

  function legend(items) {
    return el('p', { class: 'legend totals' }, items.map(([cls, text]) => el('span', { class: cls }, el('i'), text)));
  }

  function tile(label, value, cls, attrs) {
    return el('div', Object.assign({ class: 'tile' }, attrs || {}), el('div', { class: 'label' }, label), el('div', { class: 'value ' + (cls || '') }, value));
  }

  function renderSummary(st) {
    const req = st.requests || { admitted: [], rejected: [] };
    const procs = (st.fleet && st.fleet.processes) || [];
    let allowed = 0, rejected = 0, nowA = 0, nowR = 0;
    for (const r of st.rules) {
      allowed += sum(r.allowed);
      rejected += sum(r.rejected);
      nowA += last(r.allowed);
      nowR += last(r.rejected);
    }
    const lat = st.store.latency_ms || [];
    const pol = st.policy;
    const reload = pol.last_reload;
    $('summary').replaceChildren(
      tile('requests admitted, 5 min', num(sum(req.admitted)), 'allowed', { 'data-requests': 'admitted', 'data-value': sum(req.admitted) }),
      tile('requests rejected, 5 min', num(sum(req.rejected)), 'rejected', { 'data-requests': 'rejected', 'data-value': sum(req.rejected) }),
      tile('processes live', procs.filter((p) => p.live).length + ' of ' + procs.length, '', { 'data-processes': procs.length }),
      tile('allowed now', num(nowA) + '/s', 'allowed', { 'data-now': 'allowed' }),
      tile('rejected now', num(nowR) + '/s', 'rejected', { 'data-now': 'rejected' }),
      tile('decisions allowed, 5 min', num(allowed), 'allowed'),
      tile('decisions rejected, 5 min', num(rejected), 'rejected'),
      tile('store latency now', last(lat) ? last(lat).toFixed(2) + ' ms' : '–'),
      tile('circuit breaker', st.store.breaker || 'none', st.store.breaker === 'open' ? 'rejected' : ''),
      tile('policy version', pol.version || '–', 'small'),
      tile('last reload', reload ? (reload.ok ? 'ok ' : 'refused ') + clock(reload.at) : 'none', reload && !reload.ok ? 'rejected' : ''),
    );
  }

  function renderRule(r, store) {
    const totalA = sum(r.allowed), totalR = sum(r.rejected), totalS = sum(r.shadow_rejected), totalE = sum(r.store_error), totalN = sum(r.not_charged);
    const badges = [];
    if (!r.in_policy) badges.push(el('span', { class: 'badge gone' }, 'no longer in the policy'));
    if (r.mode) badges.push(el('span', { class: 'badge ' + r.mode }, r.mode));
    if (r.algorithm) badges.push(el('span', { class: 'badge' }, r.algorithm));
    // A leased rule: each process answers a hot key from slices of its
    // budget, within processes x max slice of the exact limit.
    const leased = r.limits.filter((l) => l.lease);
    if (leased.length) badges.push(el('span', { class: 'badge leased', title: 'leased quota: each process may admit up to ' + leased.map((l) => l.lease.max_slice).join(' / ') + ' tokens of a key beyond the exact limit (max slice)' }, 'leased'));
    // What the rule is, in one or two lines: its limits, then its keys,
    // its store error handling and where it is defined.
    const limits = el('p', { class: 'meta' }, r.limits.map((l, i) => [i ? ' · ' : '', l.tier ? el('b', {}, l.tier + ' ') : null, rate(l)]));
    const about = [];
    if (r.in_policy) {
      about.push('keys ', el('code', {}, r.keys.length ? r.keys.join(' + ') : 'none (one bucket)'));
      about.push(' · ', store, ' store, on error ', r.on_store_error, ' · ', el('span', { class: 'src' }, r.source));
    }
    if (r.alias) about.push(' · named ', el('code', {}, r.alias), ' in its file');
    const facts = el('p', { class: 'meta' }, about);
    const series = [
      { values: r.allowed, cls: 'allowed', area: true },
      { values: r.rejected, cls: 'rejected' },
      { values: r.shadow_rejected, cls: 'shadow' },
      { values: r.store_error, cls: 'error' },
    ];
    const mark = (cls) => el('i', { class: cls });
    return el('article', { class: 'rule', 'data-rule': r.name },
      el('header', {}, el('h3', {}, r.name), badges),
      limits,
      facts,
      chart(series, `${r.name}: allowed and rejected per second, last 5 minutes`, '/s'),
      el('p', { class: 'totals legend' },
        'last 5 min: ',
        el('span', { class: 'allowed' }, mark(), el('b', { class: 'allowed', 'data-total': 'allowed', 'data-value': totalA }, num(totalA)), ' allowed '),
        el('span', { class: 'rejected' }, mark(), el('b', { class: 'rejected', 'data-total': 'rejected', 'data-value': totalR }, num(totalR)), ' rejected '),
        totalS ? el('span', { class: 'shadow' }, mark(), `${num(totalS)} shadow rejected `) : null,
        totalE ? el('span', { class: 'error' }, mark(), `${num(totalE)} store errors `) : null,
        totalN ? el('span', { class: 'not-charged', 'data-total': 'not_charged' }, `${num(totalN)} not charged (another rule rejected) `) : null,
      ),
    );
  }

  function renderRanking(table, boundEl, rk, which) {
    const head = el('thead', {}, el('tr', {},
      el('th', {}, 'key'), el('th', {}, 'rule'), el('th', { class: 'num' }, which),
      el('th', { class: 'num' }, 'tokens'), el('th', { class: 'num' }, 'retry in')));
    const body = el('tbody');
    if (!rk.keys.length) {
      body.append(el('tr', {}, el('td', { colspan: 5, class: 'empty' }, 'none in this period')));
    }
    for (const k of rk.keys) {
      const limit = k.limit !== k.rule ? k.limit : k.rule;
      body.append(el('tr', { 'data-hot': which },
        el('td', { class: 'key', title: k.key }, k.key),
        el('td', {}, limit),
        el('td', { class: 'num', 'data-value': k.count }, num(k.count), k.error ? el('span', { class: 'err' }, ' ±' + num(k.error)) : null),
        el('td', { class: 'num' }, k.tokens === null ? '–' : num(k.tokens) + (k.capacity ? ' / ' + num(k.capacity) : '')),
        el('td', { class: 'num' }, ms(k.retry_after_ms))));
    }
    table.replaceChildren(
      el('colgroup', {}, el('col', { class: 'c-key' }), el('col'), el('col'), el('col'), el('col')),
      head, body);
    boundEl.textContent = `Since ${clock(rk.since)}: ${num(rk.total)} counted, ${rk.counters} counters a shard; a count is off by at most ±${num(rk.error_bound)} (at most total ÷ counters), and every key above that is listed.`;
  }

  function renderFleet(st) {
    const f = st.fleet;
    const head = el('thead', {}, el('tr', {},
      el('th', {}, 'process'), el('th', {}, 'state'), el('th', { class: 'num' }, 'admitted'), el('th', { class: 'num' }, 'rejected'),
      el('th', { class: 'num' }, 'now /s'), el('th', { class: 'num' }, 'share'), el('th', { class: 'num' }, 'last seen')));
    const body = el('tbody');
    for (const p of f.processes) {
      body.append(el('tr', { 'data-process': p.id, 'data-state': p.state },
        el('td', { class: 'key', title: p.id }, p.id, p.self ? el('span', { class: 'err' }, ' (this one)') : null),
        el('td', {}, el('span', { class: p.state }, p.state)),
        el('td', { class: 'num', 'data-admitted': p.admitted }, num(p.admitted)),
        el('td', { class: 'num', 'data-rejected': p.rejected }, num(p.rejected)),
        el('td', { class: 'num' }, num(p.admitted_now + p.rejected_now)),
        el('td', { class: 'num' }, (Math.round(p.share * 1000) / 10) + '%'),
        el('td', { class: 'num' }, p.self ? 'now' : ms(p.age_ms) + ' ago')));
    }
    $('fleet').replaceChildren(
      el('colgroup', {}, el('col', { class: 'c-proc' }), el('col'), el('col'), el('col'), el('col'), el('col'), el('col')),
      head, body);
    $('fleet-note').textContent = f.shared
      ? `every process on this store, ${f.max_processes} at most; live: reported within ${f.live_s}s`
      : 'this process alone: its store (memory) is its own';
    const fe = $('fleet-error');
    fe.hidden = !f.error;
    fe.textContent = f.error || '';
    const req = st.requests;
    $('requests').replaceChildren(
      chart([{ values: req.admitted, cls: 'allowed', area: true }, { values: req.rejected, cls: 'rejected' }], 'requests admitted and rejected per second, the whole fleet, last 5 minutes', '/s'),
      legend([['allowed', 'admitted'], ['rejected', 'rejected (by an enforce-mode rule)']]));
  }

  function renderStore(st) {
    const s = st.store;
    $('store-url').textContent = s.url || '';
    const facts = el('dl', { class: 'facts' });
    const fact = (k, v) => facts.append(el('dt', {}, k), el('dd', {}, v));
    fact('circuit breaker', s.breaker || 'none exported by this store');
    const names = {
      sluice_redis_overlimit_cache_hits_total: 'over-limit cache hits',
      sluice_redis_breaker_opens_total: 'breaker openings',
      sluice_redis_store_errors_total: 'Redis errors',
      sluice_live_keys: 'live keys',
      'sluice_memory_evictions_total{state="full"}': 'evictions of full buckets',
      'sluice_memory_evictions_total{state="partial"}': 'evictions of partial buckets',
      sluice_postgres_violations_dropped_total: 'violations dropped',
    };
    for (const [k, label] of Object.entries(names)) {
      if (k in (s.metrics || {})) fact(label, num(s.metrics[k]));
    }
    fact('calls, 5 min', num(sum(s.calls)));
    fact('errors, 5 min', num(sum(s.errors)));
    $('store-calls').replaceChildren(el('h3', {}, 'Store calls and errors per second'),
      chart([{ values: s.calls, cls: 'allowed', area: true }, { values: s.errors, cls: 'rejected' }], 'store calls and errors per second', '/s'),
      legend([['allowed', 'calls'], ['rejected', 'errors']]), facts);
    $('store-latency').replaceChildren(el('h3', {}, 'Store latency'),
      chart([{ values: s.max_latency_ms, cls: 'latency-max' }, { values: s.latency_ms, cls: 'latency' }], 'store latency, mean and slowest per second, milliseconds', ' ms'),
      legend([['latency', 'mean per second, and the slowest call (light)']]));
  }

  function renderPolicy(st) {
    const p = st.policy;
    const dl = $('policy');
    const items = [
      ['source', p.source || '–'],
      ['version', p.version ? p.version + ' (SHA-256 of the file)' : '–'],
      ['in force since', clock(p.loaded_at)],
      ['policies installed', String(p.changes)],
      ['keys shown', st.keys_hashed ? 'hashed (ui.show_keys: false)' : 'as sent'],
      ['process started', clock(st.started_at)],
    ];
    const nodes = [];
    for (const [k, v] of items) nodes.push(el('dt', {}, k), el('dd', {}, v));
    const r = p.last_reload;
    let reload;
    if (!r) reload = 'none yet';
    else if (r.ok) reload = el('span', {}, el('span', { class: 'ok' }, 'applied'), ` at ${clock(r.at)}`);
    else reload = el('span', {}, el('span', { class: 'bad' }, 'refused'), ` at ${clock(r.at)}, the policy in force kept serving`, el('pre', { class: 'reload' }, r.error || ''));
    nodes.push(el('dt', {}, 'last reload'), el('dd', { 'data-reload': r ? (r.ok ? 'ok' : 'refused') : 'none' }, reload));
    dl.replaceChildren(...nodes);
  }

  let refreshes = 0;
  let csrf = '';

  // The search: the key's bucket under every rule, each with a button
  // that refills it (POST ui/reset with the session's CSRF token).
  async function search(key) {
    const status = $('search-status');
    status.textContent = 'reading…';
    let res;
    try {
      const resp = await fetch('v1/stats/key?key=' + encodeURIComponent(key), { credentials: 'same-origin', cache: 'no-store', headers: { Accept: 'application/json' } });
      res = await resp.json();
      if (!resp.ok) {
        status.textContent = res.detail || `answered ${resp.status}`;
        return;
      }
    } catch (e) {
      status.textContent = 'sluice did not answer';
      return;
    }
    status.textContent = res.peek_error ? 'Tokens unknown: ' + res.peek_error : `${res.buckets.length} buckets of ${res.key}` + (res.truncated ? ' (the first 64 limits)' : '');
    const body = el('tbody');
    for (const b of res.buckets) {
      const btn = el('button', { class: 'reset', type: 'button', 'data-reset': b.limit }, 'reset');
      btn.addEventListener('click', () => reset(b.limit, res.key));
      body.append(el('tr', { 'data-bucket': b.limit },
        el('td', {}, b.limit), el('td', {}, b.algorithm),
        el('td', { class: 'num', 'data-tokens': b.tokens === null ? '' : b.tokens }, b.tokens === null ? '–' : num(b.tokens) + ' / ' + num(b.capacity)),
        el('td', { class: 'num' }, ms(b.retry_after_ms)),
        el('td', { class: 'num' }, btn)));
    }
    $('search-result').replaceChildren(
      el('thead', {}, el('tr', {}, el('th', {}, 'limit'), el('th', {}, 'algorithm'), el('th', { class: 'num' }, 'tokens'), el('th', { class: 'num' }, 'retry in'), el('th', { class: 'num' }, ''))),
      body);
  }

  async function reset(limit, key) {
    const status = $('search-status');
    try {
      const resp = await fetch('ui/reset', {
        method: 'POST', credentials: 'same-origin', cache: 'no-store',
        headers: { 'X-CSRF-Token': csrf, Accept: 'application/json' },
        body: new URLSearchParams({ rule: limit, key }),
      });
      const res = await resp.json();
      status.textContent = resp.ok ? `${limit}: the bucket of ${key} is full again` : (res.detail || `answered ${resp.status}`);
    } catch (e) {
      status.textContent = 'sluice did not answer';
      return;
    }
    search(key);
  }

  $('search-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const key = $('search-key').value;
    if (key) search(key);
  });

  function render(st) {
    refreshes++;
    csrf = st.csrf || '';
    renderSummary(st);
    renderFleet(st);
    $('rules').replaceChildren(...(st.rules.length ? st.rules.map((r) => renderRule(r, (st.store.url || 'memory://').split(':')[0])) : [el('p', { class: 'empty' }, 'The policy has no rules.')]));
    renderRanking($('hot-rejections'), $('bound-rejections'), st.hot_keys.by_rejections, 'rejections');
    renderRanking($('hot-traffic'), $('bound-traffic'), st.hot_keys.by_traffic, 'decisions');
    $('hot-note').textContent = st.keys_hashed ? 'keys hashed (ui.show_keys: false)' : 'this period and the one before';
    const pe = $('peek-error');
    pe.hidden = !st.hot_keys.peek_error;
    pe.textContent = st.hot_keys.peek_error ? 'Tokens unknown: ' + st.hot_keys.peek_error : '';
    renderStore(st);
    renderPolicy(st);
    const status = $('status');
    status.dataset.state = 'ok';
    status.dataset.refreshes = String(refreshes);
    status.textContent = `updated ${clock(st.generated_at)}`;
  }

  function fail(message, stop) {
    const status = $('status');
    status.dataset.state = 'error';
    status.textContent = message;
    return stop;
  }

  async function refresh() {
    let stop = false;
    try {
      const resp = await fetch('v1/stats', { credentials: 'same-origin', cache: 'no-store', headers: { Accept: 'application/json' } });
      if (resp.status === 401 || resp.status === 403) {
        stop = fail('Logged out (the session expired or the token changed): reload the page to log in.', true);
      } else if (!resp.ok) {
        fail(`/v1/stats answered ${resp.status}; retrying`, false);
      } else {
        render(await resp.json());
      }
    } catch (e) {
      fail('sluice did not answer; retrying', false);
    }
    if (!stop) setTimeout(refresh, REFRESH_MS);
  }

  refresh();
})();
