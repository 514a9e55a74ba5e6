// ringlimit console: polls api/cluster and draws it. Every string that
// comes from the server is put into the page as text (textContent or a
// text node), never parsed as HTML: keys are client-derived.
'use strict';
(function () {
  const SVG = 'http://www.w3.org/2000/svg';
  const params = new URLSearchParams(location.search);
  const refreshMs = Math.max(250, Number(params.get('refresh') || 1000));
  let last = null;        // last api/cluster answer, parsed
  let selected = null;    // partition shown in the detail line
  let inspected = null;   // key last inspected

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') e.className = v; else e.setAttribute(k, v);
    }
    for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    return e;
  }
  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }
  function fill(tbody, rows) { tbody.replaceChildren(...rows); }
  function byId(id) { return document.getElementById(id); }

  // A stable colour per member name.
  const palette = ['#4e79a7', '#f28e2b', '#59a14f', '#b07aa1', '#76b7b2', '#edc948', '#9c755f', '#e15759', '#bab0ac', '#86bcb6', '#d37295', '#8cd17d'];
  function colour(name) {
    if (!name) return '#d0d4da';
    let h = 0;
    for (const c of name) h = (h * 31 + c.codePointAt(0)) >>> 0;
    return palette[h % palette.length];
  }
  function majority(values) {
    const n = new Map();
    for (const v of values) n.set(v, (n.get(v) || 0) + 1);
    let best = null, bc = 0;
    for (const [v, c] of n) if (c > bc) { best = v; bc = c; }
    return best;
  }
  function ms(n) { return n >= 1000 ? (n / 1000).toFixed(1) + ' s' : n + ' ms'; }

  async function poll() {
    try {
      const r = await fetch('api/cluster', { cache: 'no-store' });
      if (!r.ok) throw new Error('api/cluster answered ' + r.status);
      last = await r.json();
      byId('status').textContent = '';
      draw(last);
      // When the first full view was drawn, for the load-time check.
      if (!document.body.dataset.firstDraw) document.body.dataset.firstDraw = String(Math.round(performance.now()));
    } catch (e) {
      byId('status').textContent = 'no answer from this node: ' + e.message;
    }
    setTimeout(poll, refreshMs);
  }

  function draw(c) {
    const self = c.nodes[0];
    const nodes = new Map(c.nodes.map(n => [n.name, n]));
    byId('summary').textContent = `node ${self.name} · ${self.members.length} members · ${self.partitions.length} partitions · ring v${self.ring_version} · refreshed ${new Date(self.at).toLocaleTimeString()}`;
    drawMembers(self, nodes, c.unreached);
    drawPartitions(self, nodes);
    drawTraffic(c.nodes);
    drawTimeline(c.nodes);
    drawHot(c.nodes);
    drawPolicies(self, nodes);
    byId('reset').hidden = !(self.actions && inspected);
  }

  function drawMembers(self, nodes, unreached) {
    const reports = [...nodes.values()];
    const polMaj = majority(reports.map(n => n.policy_version));
    const fpMaj = majority(reports.map(n => n.fingerprint));
    const rows = self.members.map(m => {
      const n = nodes.get(m.name);
      const tr = el('tr', { 'data-member': m.name });
      const gossip = el('td', { class: m.gossip === 'alive' ? 'ok' : 'bad' }, m.gossip);
      let live = m.liveness_ended ? 'ended' : 'epoch ' + m.liveness_epoch;
      if (n) live += ' · ' + (n.liveness_left_ms > 0 ? ms(n.liveness_left_ms) + ' left' : 'lapsed');
      const pv = n ? n.policy_version : m.policy_version;
      const pvCell = el('td', { class: pv !== polMaj ? 'odd' : '' }, String(pv));
      const fp = n ? n.fingerprint : (m.ignored ? 'ignored: ' + m.ignored : 'not reached');
      const fpCell = el('td', { class: fp !== fpMaj ? 'odd' : '' }, fp);
      tr.append(
        el('td', {}, el('i', { class: 'sw' }), m.name),
        el('td', {}, m.rpc_addr || '—'),
        gossip,
        el('td', {}, m.incarnation || '—'),
        el('td', { class: m.liveness_ended || (n && n.liveness_left_ms <= 0) ? 'bad' : '' }, live),
        el('td', {}, n ? (n.voter ? 'voter' : 'learner') : '?'),
        el('td', {}, n ? `${n.leader || 'none'} · ${n.term}` : 'not reached'),
        el('td', { class: n && n.ready ? 'ok' : 'bad' }, n ? (n.ready ? 'ready' : 'not ready: ' + n.not_ready) : 'not reached'),
        pvCell, fpCell);
      tr.firstChild.firstChild.style.background = colour(m.name);
      if (!n) tr.classList.add('unreached');
      return tr;
    });
    fill(byId('members').tBodies[0], rows);
    byId('unreached').textContent = unreached.length ? 'not answering: ' + unreached.map(u => u.url + ' (' + u.error + ')').join('; ') : '';
  }

  function partState(p, nodes) {
    if (!p.h) return 'vacant';
    const holder = nodes.get(p.h);
    const mine = holder && holder.partitions.find(q => q.p === p.p);
    if (mine && mine.s === 'fenced') return 'fenced';
    if (p.t && p.t !== p.h) return 'moving';
    return 'held';
  }

  function drawPartitions(self, nodes) {
    const parts = self.partitions;
    const cols = 32, cell = 14, rows = Math.ceil(parts.length / cols);
    const map = byId('partmap');
    map.setAttribute('viewBox', `0 0 ${cols * cell} ${rows * cell}`);
    const counts = new Map();
    const rects = parts.map((p, i) => {
      counts.set(p.h || '(vacant)', (counts.get(p.h || '(vacant)') || 0) + 1);
      const st = partState(p, nodes);
      const r = svg('rect', {
        x: (i % cols) * cell + 1, y: Math.floor(i / cols) * cell + 1, width: cell - 2, height: cell - 2,
        fill: colour(p.h), 'data-p': p.p, 'data-state': st, 'data-holder': p.h || '',
      });
      if (st !== 'held') { r.setAttribute('stroke', '#b3261e'); r.setAttribute('stroke-width', '2'); r.setAttribute('stroke-dasharray', st === 'moving' ? '3 2' : ''); }
      if (st === 'vacant') r.setAttribute('fill', '#ffffff');
      const t = svg('title', {});
      t.textContent = `partition ${p.p}: ${p.h || 'vacant'}`;
      r.append(t);
      r.addEventListener('click', () => { selected = p.p; showPart(); });
      return r;
    });
    map.replaceChildren(...rects);
    byId('legend').replaceChildren(...[...counts.entries()].sort().map(([m, n]) => {
      const i = el('i'); i.style.background = m === '(vacant)' ? '#fff' : colour(m);
      return el('span', { 'data-member': m }, i, `${m}: ${n}`);
    }));
    showPart();
  }

  function showPart() {
    if (selected === null || !last) return;
    const nodes = new Map(last.nodes.map(n => [n.name, n]));
    const p = last.nodes[0].partitions.find(q => q.p === selected);
    if (!p) return;
    const holder = nodes.get(p.h);
    const mine = holder && holder.partitions.find(q => q.p === p.p);
    const keys = mine ? String(mine.k || 0) : (p.h ? 'holder not reached' : '—');
    byId('partdetail').textContent = `partition ${p.p}: holder ${p.h || 'none (vacant)'}, backup ${p.b || 'none'}, epoch ${p.e}, ring target ${p.t || '—'}, ${partState(p, nodes)}, keys ${keys}`;
  }

  function drawTraffic(nodes) {
    const box = byId('traffic');
    const withT = nodes.filter(n => n.traffic);
    if (!withT.length) { box.replaceChildren(el('p', {}, 'No traffic recorded (the console has no Recorder).')); return; }
    const t0 = withT[0].traffic;
    const nb = t0.latency.length, bs = t0.bucket_seconds;
    const pols = new Map();
    const lat = Array.from({ length: nb }, () => new Array(t0.latency_bounds.length).fill(0));
    for (const n of withT) {
      const off = Math.round((n.traffic.start - t0.start) / bs);
      for (const [name, series] of Object.entries(n.traffic.policies)) {
        if (!pols.has(name)) pols.set(name, Array.from({ length: nb }, () => [0, 0, 0]));
        const acc = pols.get(name);
        series.forEach((v, i) => { const j = i + off; if (j >= 0 && j < nb) for (let k = 0; k < 3; k++) acc[j][k] += v[k]; });
      }
      n.traffic.latency.forEach((h, i) => { const j = i + off; if (j >= 0 && j < nb) h.forEach((c, k) => lat[j][k] += c); });
    }
    const charts = [...pols.entries()].sort().map(([name, series]) => chart(name, series.map(v => v.map(x => x / bs)), ['allowed', 'over limit', 'unavailable'], ['#59a14f', '#f28e2b', '#e15759'], '/s'));
    const p99 = lat.map(h => {
      const total = h.reduce((a, b) => a + b, 0);
      if (!total) return [0];
      let acc = 0;
      for (let k = 0; k < h.length; k++) { acc += h[k]; if (acc >= 0.99 * total) return [t0.latency_bounds[k] * 1000]; }
      return [0];
    });
    charts.push(chart('p99 forward latency (decisions sent to the holder; an upper bound per bucket)', p99, ['p99'], ['#4e79a7'], ' ms'));
    if (!pols.size) charts.unshift(el('p', {}, 'No decisions in the last 15 minutes.'));
    box.replaceChildren(...charts);
  }

  function chart(title, series, names, colours, unit) {
    const w = 540, h = 90, pad = 30;
    let maxv = 0;
    for (const v of series) for (const x of v) maxv = Math.max(maxv, x);
    const s = svg('svg', { viewBox: `0 0 ${w} ${h + 14}`, width: '100%' });
    s.append(svg('line', { x1: pad, y1: h, x2: w, y2: h, stroke: '#ccd' }));
    const top = svg('text', { x: 0, y: 10 }); top.textContent = (maxv < 10 ? maxv.toFixed(2) : Math.round(maxv)) + unit; s.append(top);
    const left = svg('text', { x: pad, y: h + 12 }); left.textContent = '−15 min'; s.append(left);
    const right = svg('text', { x: w - 24, y: h + 12 }); right.textContent = 'now'; s.append(right);
    names.forEach((_, k) => {
      const pts = series.map((v, i) => `${pad + (i * (w - pad)) / Math.max(series.length - 1, 1)},${h - (maxv ? (v[k] || 0) / maxv * (h - 12) : 0)}`);
      s.append(svg('polyline', { points: pts.join(' '), fill: 'none', stroke: colours[k], 'stroke-width': 1.5 }));
    });
    // The newest bucket is still filling: label the last full one.
    const now = series[series.length - 2] || [];
    const head = el('h3', {}, el('b', {}, title));
    names.forEach((n, k) => { const sw = el('i', { class: 'sw' }); sw.style.background = colours[k]; head.append(sw, `${n} ${(now[k] || 0).toFixed(1)}${unit}`); });
    return el('div', { class: 'chart' }, head, s);
  }

  function drawTimeline(nodes) {
    const all = nodes.flatMap(n => n.events).sort((a, b) => new Date(b.at) - new Date(a.at) || a.node.localeCompare(b.node));
    // One line per thing seen by several nodes within 5 s.
    const merged = [];
    for (const e of all) {
      const t = new Date(e.at).getTime();
      const same = merged.find(m => m.kind === e.kind && m.text === e.text && Math.abs(m.t - t) < 5000);
      if (same) { if (!same.seen.includes(e.node)) same.seen.push(e.node); continue; }
      merged.push({ ...e, t, seen: [e.node] });
    }
    const items = merged.slice(0, 300).map(e => el('li', { 'data-kind': e.kind },
      el('span', { class: 't' }, new Date(e.t).toLocaleTimeString()),
      el('span', { class: 'k k-' + e.kind }, e.kind),
      e.text, ' ', el('span', { class: 'seen' }, '(seen by ' + e.seen.sort().join(', ') + ')')));
    byId('timeline').replaceChildren(...items);
  }

  function drawHot(nodes) {
    const rows = nodes.flatMap(n => n.hot_keys).sort((a, b) => b.rate - a.rate).slice(0, 25).map(k => el('tr', {},
      el('td', {}, k.tenant), el('td', {}, k.subject), el('td', {}, k.policy), el('td', {}, k.holder),
      el('td', {}, k.rate.toFixed(1)), el('td', {}, k.spread ? `${k.rights_granted} · ${k.rights_left}${k.asking ? ' (asking)' : ''}` : '—')));
    fill(byId('hotkeys').tBodies[0], rows.length ? rows : [el('tr', {}, el('td', { colspan: 6 }, 'no hot keys'))]);
  }

  function drawPolicies(self, nodes) {
    fill(byId('policies').tBodies[0], (self.policies || []).map(p => el('tr', {},
      el('td', {}, p.name + (p.shadow ? ' (shadow)' : '')), el('td', {}, String(p.limit)), el('td', {}, p.window), el('td', {}, p.algorithm), el('td', {}, p.on_unavailable))));
    const vs = self.members.map(m => { const n = nodes.get(m.name); return `${m.name}: v${n ? n.policy_version : m.policy_version}`; });
    byId('policyversions').textContent = 'table version on each member — ' + vs.join(', ');
  }

  async function inspect(ev) {
    ev.preventDefault();
    const f = new FormData(byId('inspect'));
    inspected = { tenant: f.get('tenant'), subject: f.get('subject'), policy: f.get('policy') };
    const out = byId('inspection');
    const r = await fetch('api/peek?' + new URLSearchParams(inspected), { cache: 'no-store' });
    const d = await r.json();
    if (!r.ok) { out.replaceChildren(el('p', { class: 'bad' }, d.error)); return; }
    const dl = el('p', {}, `key ${inspected.tenant} / ${inspected.subject} / ${inspected.policy}: holder ${d.holder} (ring target ${d.target}), ${d.count} of ${d.limit} used in the window, ${d.remaining} remaining, ` +
      (d.allowed ? 'a unit is free now' : `next unit frees in ${ms(d.next_free_ms)}`) + `, empty in ${ms(d.reset_ms)} (${d.algorithm})`);
    const kids = [dl];
    if (d.frees && d.frees.length) kids.push(freesChart(d));
    out.replaceChildren(...kids);
    byId('reset').hidden = !(last && last.nodes[0].actions);
    byId('resetresult').textContent = '';
  }

  // Admissions in the window, from when their units free: a unit that
  // frees in x was admitted window − x ago.
  function freesChart(d) {
    const w = 540, h = 70, n = 12;
    const buckets = new Array(n).fill(0);
    let prevUnits = d.remaining;
    for (const f of d.frees) {
      const age = d.window_ms - f.in_ms;
      const b = Math.min(n - 1, Math.max(0, Math.floor((age / d.window_ms) * n)));
      buckets[n - 1 - b] += f.units - prevUnits;
      prevUnits = f.units;
    }
    const maxb = Math.max(...buckets, 1);
    const s = svg('svg', { viewBox: `0 0 ${w} ${h + 14}`, width: '100%', id: 'freechart' });
    buckets.forEach((c, i) => {
      const bh = (c / maxb) * h;
      const r = svg('rect', { x: i * (w / n) + 2, y: h - bh, width: w / n - 4, height: bh, fill: '#4e79a7' });
      const t = svg('title', {}); t.textContent = `${c} units`; r.append(t);
      s.append(r);
    });
    const l = svg('text', { x: 0, y: h + 12 }); l.textContent = 'window start'; s.append(l);
    const r = svg('text', { x: w - 24, y: h + 12 }); r.textContent = 'now'; s.append(r);
    return el('div', { class: 'chart' }, el('h3', {}, 'admissions in the window (by age)'), s);
  }

  async function reset(ev) {
    ev.preventDefault();
    const tok = new FormData(byId('reset')).get('token');
    const r = await fetch('api/reset', { method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: 'Bearer ' + tok }, body: JSON.stringify(inspected) });
    const d = await r.json();
    byId('resetresult').textContent = r.ok ? `reset by ${d.holder}` : `refused (${r.status}): ${d.error}`;
  }

  document.addEventListener('DOMContentLoaded', () => {
    byId('inspect').addEventListener('submit', inspect);
    byId('reset').addEventListener('submit', reset);
    poll();
  });
})();
