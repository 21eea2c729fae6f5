// gaffer console: a single page over the task service's own API.
//
// Plain JS, no framework and no build step. The CSP allows no inline script or style,
// so every handler is attached with addEventListener and every look is a CSS class.
// Text from the server (task ids, notes, errors) only ever goes in through
// textContent, never as HTML.
'use strict';

(() => {
  // The path the api serves under (a proxy may add a prefix before /ui/).
  const ROOT = location.pathname.replace(/\/ui(\/.*)?$/, '');
  const LOGIN = ROOT + '/ui/login';
  // The dashboard's refresh rate.
  const REFRESH_MS = 2000;
  // Points kept per sparkline: two minutes at the refresh rate.
  const SPARK_POINTS = 60;
  const END_STATES = new Set(['done', 'failed', 'cancelled']);
  const TASK_STATES = ['waiting', 'running', 'done', 'failed', 'cancelled', 'frozen', 'cancelling'];

  const $ = (sel, root = document) => root.querySelector(sel);

  // ---------------------------------------------------------------- DOM helpers

  /// An element: `h('td', {class: 'num', dataset: {col: 'ready'}}, text, child…)`.
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    setAttrs(el, attrs);
    append(el, children);
    return el;
  }

  function setAttrs(el, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'dataset') Object.assign(el.dataset, v);
      else if (k === 'on') for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
      else if (k === 'class') el.className = v;
      else if (k === 'text') el.textContent = v;
      else if (v === true) el.setAttribute(k, '');
      else el.setAttribute(k, v);
    }
  }

  function append(el, children) {
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
  }

  const SVG = 'http://www.w3.org/2000/svg';
  function svg(tag, attrs) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
    return el;
  }

  function badge(state, extra) {
    const s = state === null || state === undefined ? 'unknown' : String(state);
    return h('span', { class: `badge state-${s.replace(/[^a-z]/g, '')}`, dataset: { state: s }, ...extra }, s);
  }

  function link(href, text, attrs) {
    return h('a', { href, ...attrs }, text);
  }

  function enc(s) {
    return encodeURIComponent(s);
  }

  // ---------------------------------------------------------------- formatting

  function fmtCount(n) {
    if (n === null || n === undefined) return '-';
    if (n >= 1e6) return (n / 1e6).toFixed(1) + 'M';
    if (n >= 1e4) return (n / 1e3).toFixed(1) + 'k';
    return String(n);
  }

  function fmtRate(r) {
    if (r === null || r === undefined || Number.isNaN(r)) return '-';
    if (r === 0) return '0';
    if (r < 10) return r.toFixed(1);
    return fmtCount(Math.round(r));
  }

  /// A span of ms as the dashboard shows it: 4.2s, 37s, 12m05s, 3h20m.
  function fmtAge(ms) {
    if (!ms) return '-';
    const s = Math.floor(ms / 1000);
    if (ms < 10000) return (ms / 1000).toFixed(1) + 's';
    if (s < 60) return s + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm' + String(s % 60).padStart(2, '0') + 's';
    return Math.floor(s / 3600) + 'h' + String(Math.floor((s % 3600) / 60)).padStart(2, '0') + 'm';
  }

  function fmtBytes(b) {
    if (!b) return '0';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (b >= 1024 && i < units.length - 1) {
      b /= 1024;
      i += 1;
    }
    return (i === 0 ? b : b.toFixed(b < 10 ? 1 : 0)) + ' ' + units[i];
  }

  /// An RFC 3339 time as local date and time with ms; the full text in the title.
  function timeEl(text) {
    if (!text) return h('span', { class: 'muted' }, '-');
    const d = new Date(text);
    if (Number.isNaN(d.getTime())) return h('span', {}, text);
    const pad = (n, w = 2) => String(n).padStart(w, '0');
    const shown = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
    return h('time', { datetime: text, title: text }, shown);
  }

  function jsonText(v) {
    return JSON.stringify(v, null, 2);
  }

  // ---------------------------------------------------------------- API calls

  /// A refusal from the API: its status and message.
  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  const session = { key: null, admin: false, queues: [], csrf: null, user: null };

  /// One call to the API with the session cookie; a 401 goes to the login page.
  async function api(method, path, body) {
    const init = { method, credentials: 'same-origin', headers: { Accept: 'application/json' } };
    if (method !== 'GET' && method !== 'HEAD') {
      init.headers['X-CSRF-Token'] = session.csrf || '';
      init.body = body === undefined ? '' : JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(ROOT + path, init);
    } catch (e) {
      throw new ApiError(0, `the console cannot reach the api: ${e.message}`);
    }
    if (res.status === 401) {
      location.assign(LOGIN);
      throw new ApiError(401, 'not logged in');
    }
    const text = await res.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (_) {
      data = null;
    }
    if (!res.ok) {
      const msg = data && data.error ? data.error : `${res.status} ${res.statusText}`;
      throw new ApiError(res.status, msg);
    }
    return data;
  }

  const get = (path) => api('GET', path);
  const post = (path, body) => api('POST', path, body);

  // ---------------------------------------------------------------- banners

  function showError(e) {
    const el = $('#error');
    el.textContent = e instanceof Error ? e.message : String(e);
    el.hidden = false;
  }

  function clearError() {
    $('#error').hidden = true;
  }

  let flashTimer = null;
  function flash(text) {
    const el = $('#flash');
    el.textContent = text;
    el.hidden = false;
    clearTimeout(flashTimer);
    flashTimer = setTimeout(() => { el.hidden = true; }, 6000);
  }

  /// Asks before a destructive action; resolves true on confirm.
  function confirmAction(text) {
    const dialog = $('#confirm-dialog');
    $('#confirm-text').textContent = text;
    dialog.returnValue = '';
    return new Promise((resolve) => {
      dialog.addEventListener('close', () => resolve(dialog.returnValue === 'ok'), { once: true });
      dialog.showModal();
    });
  }

  /// Runs an action from a button: disables it meanwhile, shows the outcome, refreshes.
  async function act(button, what, fn) {
    if (button) button.disabled = true;
    try {
      const out = await fn();
      clearError();
      if (what) flash(typeof what === 'function' ? what(out) : what);
      await refreshNow();
      return out;
    } catch (e) {
      showError(e);
      return null;
    } finally {
      if (button) button.disabled = false;
    }
  }

  // ---------------------------------------------------------------- routing

  // The page shown: { name, render(view), refresh(), live }. `gen` drops answers of a
  // page the user has left.
  let page = null;
  let gen = 0;
  let refreshing = false;

  function parseRoute() {
    const parts = location.hash.replace(/^#\/?/, '').split('/').map((p) => {
      try {
        return decodeURIComponent(p);
      } catch (_) {
        return p;
      }
    });
    const [head, ...rest] = parts;
    switch (head) {
      case '':
      case undefined:
        return overviewPage();
      case 'queues':
        return rest.length >= 1 ? queuePage(rest[0]) : overviewPage();
      case 'tasks':
        return rest.length >= 2 ? taskPage(rest[0], rest.slice(1).join('/')) : overviewPage();
      case 'chains':
        return chainPage(rest.join('/'));
      case 'hosts':
        return hostsPage();
      case 'systems':
        return systemsPage();
      case 'search':
        return searchPage(rest.join('/'));
      default:
        return notFoundPage(location.hash);
    }
  }

  async function navigate() {
    gen += 1;
    clearError();
    page = parseRoute();
    const view = $('#view');
    view.replaceChildren();
    view.dataset.page = page.name;
    view.dataset.loaded = '0';
    view.dataset.refreshes = '0';
    for (const a of document.querySelectorAll('#nav a')) {
      a.classList.toggle('active', a.dataset.route === page.name);
    }
    document.title = `gaffer · ${page.title || page.name}`;
    page.render(view);
    await refreshNow();
  }

  /// Refreshes the page shown, unless a refresh is under way.
  async function refreshNow() {
    if (!page || refreshing) return;
    refreshing = true;
    const mine = gen;
    const view = $('#view');
    const started = performance.now();
    try {
      await page.refresh(() => mine === gen);
      if (mine === gen) {
        // How long the last refresh took, its reads and drawing: what the tests measure.
        view.dataset.refreshMs = String(Math.round(performance.now() - started));
        // When the page was first shown, counted from the navigation's start.
        if (view.dataset.loaded !== '1') view.dataset.shownAtMs = String(Math.round(performance.now()));
        view.dataset.loaded = '1';
        view.dataset.refreshes = String(Number(view.dataset.refreshes || 0) + 1);
        if (page.clearsError !== false) clearError();
      }
    } catch (e) {
      if (mine === gen) showError(e);
    } finally {
      refreshing = false;
    }
  }

  function tick() {
    if (document.hidden || !page || !page.live) return;
    refreshNow();
  }

  // ---------------------------------------------------------------- cluster figures

  // The polled figures of every queue, for the sparklines: name → {t, acked, errors,
  // done: [rates], errs: [rates]}. Kept across pages so the overview has history at once.
  const history = new Map();

  function record(queues, t) {
    for (const [name, q] of Object.entries(queues)) {
      const acked = q.acked_total || 0;
      const errors = (q.retried_total || 0) + (q.dead_total || 0);
      let hst = history.get(name);
      if (!hst) {
        hst = { t, acked, errors, done: [], errs: [], doneRate: null, errRate: null };
        history.set(name, hst);
        continue;
      }
      const dt = (t - hst.t) / 1000;
      if (dt <= 0.2) continue;
      const dr = acked >= hst.acked ? (acked - hst.acked) / dt : 0;
      const er = errors >= hst.errors ? (errors - hst.errors) / dt : 0;
      hst.done.push(dr);
      hst.errs.push(er);
      if (hst.done.length > SPARK_POINTS) hst.done.shift();
      if (hst.errs.length > SPARK_POINTS) hst.errs.shift();
      Object.assign(hst, { t, acked, errors, doneRate: dr, errRate: er });
    }
  }

  /// The whole cluster: `/v1/cluster` (the stats document), or, from an api without it,
  /// `/v1/queues` alone.
  let clusterEndpoint = true;
  async function fetchCluster() {
    let data;
    if (clusterEndpoint) {
      try {
        data = await get('/v1/cluster');
      } catch (e) {
        if (e.status !== 404) throw e;
        clusterEndpoint = false;
      }
    }
    if (!data) data = { queues: await get('/v1/queues') };
    // Rates count from when the api began its read, not when the answer arrived.
    record(data.queues || {}, data.at_ms || Date.now());
    return data;
  }

  function sparkline(points, kind) {
    const w = 80;
    const hgt = 18;
    const el = svg('svg', { class: `sparkline ${kind}`, width: w, height: hgt, viewBox: `0 0 ${w} ${hgt}` });
    el.append(svg('line', { class: 'base', x1: 0, y1: hgt - 0.5, x2: w, y2: hgt - 0.5 }));
    if (points.length > 1) {
      const max = Math.max(...points, 0.001);
      // A series of zeros is drawn grey: nothing happened, nothing to colour.
      if (max <= 0.001) el.classList.add('flat');
      const step = w / (SPARK_POINTS - 1);
      const start = w - step * (points.length - 1);
      const xy = points.map((p, i) =>
        `${(start + i * step).toFixed(1)},${(hgt - 1 - (p / max) * (hgt - 3)).toFixed(1)}`);
      el.append(svg('polyline', { points: xy.join(' ') }));
    }
    return el;
  }

  // ---------------------------------------------------------------- sortable tables

  /// A table whose columns sort on a click of their head; `cols` are
  /// {key, label, num, value(row) for sorting, cell(row) → td}.
  function sortableTable(id, cols, sortState, onSort) {
    const head = h('tr', {}, cols.map((c) => {
      const th = h('th', { class: c.num ? 'num' : '', dataset: c.sort === false ? {} : { sort: c.key } }, c.label);
      if (c.title) th.title = c.title;
      if (c.sort !== false) {
        th.addEventListener('click', () => {
          if (sortState.key === c.key) sortState.desc = !sortState.desc;
          else Object.assign(sortState, { key: c.key, desc: !!c.num });
          onSort();
        });
      }
      return th;
    }));
    return h('table', { id }, h('thead', {}, head), h('tbody'));
  }

  function markSorted(table, sortState) {
    for (const th of table.querySelectorAll('th[data-sort]')) {
      th.classList.toggle('sorted-asc', th.dataset.sort === sortState.key && !sortState.desc);
      th.classList.toggle('sorted-desc', th.dataset.sort === sortState.key && sortState.desc);
    }
  }

  function sortRows(rows, cols, sortState) {
    const col = cols.find((c) => c.key === sortState.key) || cols[0];
    const val = col.value || ((r) => r.name);
    rows.sort((a, b) => {
      const x = val(a);
      const y = val(b);
      let c;
      if (typeof x === 'number' || typeof y === 'number') c = (x ?? -1) - (y ?? -1);
      else c = String(x ?? '').localeCompare(String(y ?? ''));
      if (sortState.desc) c = -c;
      // Ties fall back to the name so equal rows never swap between refreshes.
      return c || a.name.localeCompare(b.name);
    });
    return rows;
  }

  // ---------------------------------------------------------------- overview

  const overviewState = {
    filter: '',
    queueSort: { key: 'name', desc: false },
    hostSort: { key: 'name', desc: false },
  };

  function queueCols() {
    const numCell = (key, f) => (r) => {
      const v = f(r);
      return h('td', { class: `num${v === 0 ? ' zero' : ''}`, dataset: { col: key } }, fmtCount(v));
    };
    const spark = (key, rateKey, pointsKey, kind) => (r) => {
      const hst = history.get(r.name);
      return h('td', { class: 'num spark', dataset: { col: key } },
        h('div', { class: 'spark-cell' },
          sparkline(hst ? hst[pointsKey] : [], kind),
          h('span', {}, fmtRate(hst ? hst[rateKey] : null))));
    };
    return [
      { key: 'name', label: 'queue', value: (r) => r.name,
        cell: (r) => h('td', { dataset: { col: 'name' } }, link(`#/queues/${enc(r.name)}`, r.name)) },
      { key: 'ready', label: 'ready', num: true, value: (r) => r.q.ready, cell: numCell('ready', (r) => r.q.ready) },
      { key: 'delayed', label: 'delayed', num: true, value: (r) => r.q.delayed, cell: numCell('delayed', (r) => r.q.delayed) },
      { key: 'running', label: 'running', num: true, value: (r) => r.q.leased, cell: numCell('running', (r) => r.q.leased) },
      { key: 'dead', label: 'dead', num: true, value: (r) => r.q.dead, cell: numCell('dead', (r) => r.q.dead) },
      { key: 'late', label: 'late', num: true, title: 'how long the longest-waiting due task has been due',
        value: (r) => r.q.oldest_due_age_ms ?? 0,
        cell: (r) => h('td', { class: 'num', dataset: { col: 'late' } }, fmtAge(r.q.oldest_due_age_ms)) },
      { key: 'done', label: 'done/s', num: true, value: (r) => history.get(r.name)?.doneRate ?? 0,
        cell: spark('done', 'doneRate', 'done', 'done') },
      { key: 'errors', label: 'errors/s', num: true, value: (r) => history.get(r.name)?.errRate ?? 0,
        cell: spark('errors', 'errRate', 'errs', 'errors') },
      { key: 'slots', label: 'slots now/wanted', num: true, value: (r) => r.q.slots ?? 0,
        cell: (r) => h('td', { class: 'num', dataset: { col: 'slots' } },
          `${r.q.slots ?? '-'}/${r.q.wanted ?? '-'}`) },
      { key: 'intake', label: 'intake', value: (r) => r.q.intake ?? '',
        cell: (r) => h('td', { dataset: { col: 'intake' } }, r.q.intake ? badge(r.q.intake) : h('span', { class: 'muted' }, '-')) },
      { key: 'paused', label: 'state', value: (r) => (r.q.paused ? 'paused' : 'active'),
        cell: (r) => h('td', { dataset: { col: 'paused' } }, badge(r.q.paused ? 'paused' : 'active')) },
    ];
  }

  function hostCols() {
    return [
      { key: 'name', label: 'host', value: (r) => r.name,
        cell: (r) => h('td', { dataset: { col: 'name' } }, r.name) },
      { key: 'state', label: 'state', value: (r) => r.h.state,
        cell: (r) => h('td', { dataset: { col: 'state' } }, hostState(r.h)) },
      { key: 'memory', label: 'memory/budget', num: true,
        value: (r) => (r.h.memory_budget_bytes ? r.h.pss_bytes / r.h.memory_budget_bytes : 0),
        cell: (r) => h('td', { class: 'num', dataset: { col: 'memory' } }, memoryEl(r.h)) },
      { key: 'load', label: 'load/cpus', num: true, value: (r) => r.h.load1 ?? 0,
        cell: (r) => h('td', { class: 'num', dataset: { col: 'load' } }, loadText(r.h)) },
      { key: 'slots', label: 'slots/capacity', num: true, value: (r) => hostSlots(r.h),
        cell: (r) => h('td', { class: 'num', dataset: { col: 'slots' } }, slotsText(r.h)) },
    ];
  }

  // A limited key's hosts carry only its queues' figures: no load, memory or capacity.
  function loadText(host) {
    return host.load1 == null ? '-' : `${host.load1.toFixed(2)}/${host.cpus ?? '?'}`;
  }

  function hostSlots(host) {
    return host.slots ?? Object.values(host.queues || {}).reduce((a, b) => a + b, 0);
  }

  function slotsText(host) {
    return `${hostSlots(host)}/${host.capacity ?? '-'}`;
  }

  function hostState(host) {
    const s = host.state || (host.alive === false ? 'dead' : 'alive');
    // Asked to drain, not draining yet: the master adopts it on its next tick.
    const el = badge(s);
    if (host.drain_requested && s === 'alive') {
      el.textContent = `${s}*`;
      el.title = 'drain requested';
    }
    return el;
  }

  function memoryEl(host) {
    if (host.pss_bytes == null && host.memory_budget_bytes == null) return h('span', { class: 'muted' }, '-');
    const budget = host.memory_budget_bytes || 0;
    const pss = host.pss_bytes || 0;
    if (!budget) return h('span', { class: 'muted' }, `${fmtBytes(pss)} / ?`);
    const m = h('meter', { min: 0, max: budget, value: Math.min(pss, budget),
      low: budget * 0.75, high: budget * 0.9, optimum: 0 });
    return h('span', { title: `${fmtBytes(pss)} of ${fmtBytes(budget)}` }, m, ' ',
      `${Math.round((pss / budget) * 100)}%`);
  }

  function overviewPage() {
    let last = null;
    let queuesTable;
    let hostsTable;
    const qcols = queueCols();
    const hcols = hostCols();

    function drawQueues() {
      if (!last) return;
      const f = overviewState.filter.toLowerCase();
      const rows = Object.entries(last.queues || {})
        .filter(([name]) => !f || name.toLowerCase().includes(f))
        .map(([name, q]) => ({ name, q }));
      sortRows(rows, qcols, overviewState.queueSort);
      const tbody = h('tbody', {}, rows.map((r) =>
        h('tr', { dataset: { queue: r.name } }, qcols.map((c) => c.cell(r)))));
      queuesTable.tBodies[0].replaceWith(tbody);
      markSorted(queuesTable, overviewState.queueSort);
      $('#queue-count').textContent =
        `${rows.length} of ${Object.keys(last.queues || {}).length} queues`;
    }

    function drawHosts() {
      const section = $('#hosts-section');
      if (!last || !last.hosts) {
        section.hidden = true;
        return;
      }
      section.hidden = false;
      const f = overviewState.filter.toLowerCase();
      const rows = Object.entries(last.hosts)
        .filter(([name]) => !f || name.toLowerCase().includes(f))
        .map(([name, hst]) => ({ name, h: hst }));
      sortRows(rows, hcols, overviewState.hostSort);
      const tbody = h('tbody', {}, rows.map((r) =>
        h('tr', { dataset: { host: r.name }, class: r.h.state === 'dead' ? 'dead-host' : '' },
          hcols.map((c) => c.cell(r)))));
      hostsTable.tBodies[0].replaceWith(tbody);
      markSorted(hostsTable, overviewState.hostSort);
    }

    function drawLease() {
      const el = $('#lease');
      const m = last && last.manager;
      if (!m) {
        el.replaceChildren(h('span', { class: 'muted' }, 'not shown to this key'));
        return;
      }
      if (!('leader' in m)) {
        // A limited key learns only whether a manager leads.
        el.replaceChildren(h('dl', { class: 'fields' },
          h('dt', {}, 'fresh'), h('dd', { id: 'lease-stale' }, m.stale ? 'stale: no manager is ticking' : 'yes')));
        return;
      }
      el.replaceChildren(h('dl', { class: 'fields' },
        h('dt', {}, 'leader'), h('dd', { id: 'lease-leader' }, m.leader || 'none'),
        h('dt', {}, 'lease epoch'), h('dd', {}, String(m.lease_epoch ?? '-')),
        h('dt', {}, 'lease ttl'), h('dd', {}, m.lease_ttl_ms != null ? fmtAge(m.lease_ttl_ms) : '-'),
        h('dt', {}, 'map'), h('dd', {}, `v${m.map_version ?? '-'} · epoch ${m.epoch ?? '-'}`),
        h('dt', {}, 'fresh'), h('dd', { id: 'lease-stale' }, m.stale ? 'stale: no manager is ticking' : 'yes')));
    }

    return {
      name: 'overview',
      title: 'overview',
      live: true,
      render(view) {
        const filter = h('input', { id: 'filter', type: 'search', placeholder: 'filter queues and hosts',
          value: overviewState.filter, 'aria-label': 'filter' });
        const onFilter = () => {
          if (overviewState.filter === filter.value) return;
          overviewState.filter = filter.value;
          drawQueues();
          drawHosts();
        };
        // 'change' too: a field cleared by a script or a driver fires no 'input'.
        for (const ev of ['input', 'change', 'search']) filter.addEventListener(ev, onFilter);
        queuesTable = sortableTable('queues-table', qcols, overviewState.queueSort, drawQueues);
        hostsTable = sortableTable('hosts-table', hcols, overviewState.hostSort, drawHosts);
        view.append(
          h('h1', {}, 'Overview'),
          h('div', { class: 'toolbar' }, filter, h('span', { id: 'queue-count', class: 'muted' }),
            h('span', { class: 'grow' }), h('span', { class: 'muted' }, 'live, every 2 s')),
          h('h2', {}, 'Queues'),
          h('div', { class: 'scroll panel' }, queuesTable),
          h('div', { class: 'cols' },
            h('section', { id: 'hosts-section' }, h('h2', {}, 'Hosts'),
              h('div', { class: 'scroll panel' }, hostsTable)),
            h('section', { id: 'lease-section' }, h('h2', {}, "Manager's lease"),
              h('div', { id: 'lease', class: 'panel' }))));
      },
      async refresh(current) {
        const data = await fetchCluster();
        if (!current()) return;
        last = data;
        drawQueues();
        drawHosts();
        drawLease();
      },
    };
  }

  // ---------------------------------------------------------------- queue page

  function queuePage(name) {
    const qpath = `/v1/queues/${enc(name)}`;
    const list = { state: '', cursor: null, stack: [] };
    const dead = { cursor: null, stack: [], selected: new Set() };
    let loadedLists = false;

    function figure(label, value, key) {
      return h('div', { class: 'figure', dataset: { figure: key } },
        h('div', { class: 'value' }, value), h('div', { class: 'label' }, label));
    }

    /// The queue's figures and switches: `GET /v1/queues/Q`, or its entry of
    /// `/v1/queues` from an api without it.
    async function fetchQueue() {
      try {
        return await get(qpath);
      } catch (e) {
        if (e.status !== 404 && e.status !== 405) throw e;
        const all = await get('/v1/queues');
        if (!all[name]) throw e;
        return { name, figures: all[name] };
      }
    }

    function drawFigures(data) {
      const q = data.figures || data.stats || data;
      const paused = data.paused ?? q.paused;
      const intake = data.intake ?? q.intake;
      $('#queue-figures').replaceChildren(
        figure('ready', fmtCount(q.ready), 'ready'),
        figure('delayed', fmtCount(q.delayed), 'delayed'),
        figure('running', fmtCount(q.leased), 'running'),
        figure('frozen', fmtCount(q.frozen), 'frozen'),
        figure('dead', fmtCount(q.dead), 'dead'),
        figure('late', fmtAge(q.oldest_due_age_ms), 'late'),
        figure('slots now/wanted', `${q.slots ?? '-'}/${q.wanted ?? '-'}`, 'slots'),
        figure('done total', fmtCount(q.acked_total), 'done-total'));
      const st = $('#queue-state');
      st.replaceChildren('state ', badge(paused ? 'paused' : 'active', { id: 'queue-paused' }),
        ' intake ', intake ? badge(intake, { id: 'queue-intake' }) : h('span', { id: 'queue-intake', class: 'muted' }, '-'));
      if (session.admin) {
        $('#pause-btn').hidden = !!paused;
        $('#resume-btn').hidden = !paused;
        const sel = $('#intake-select');
        if (intake && document.activeElement !== sel && !sel.dataset.touched) sel.value = intake;
      }
      const config = data.config;
      const cfg = $('#queue-config');
      if (config === undefined) {
        cfg.replaceChildren(h('span', { class: 'muted' }, 'not served by this api'));
      } else if (config === null) {
        cfg.replaceChildren(h('span', { class: 'muted', id: 'queue-config-none' },
          'no config in force is recorded: no manager leads, or it does not name this queue'));
      } else {
        const origin = data.config_origin === 'file'
          ? "the leading manager's own file (no config published)"
          : `published config v${data.config_version ?? '?'}`;
        cfg.replaceChildren(
          h('p', { class: 'muted', id: 'queue-config-origin' }, `${origin}; keys as written there, defaults not filled in`),
          h('pre', { class: 'json', id: 'queue-config-json' }, jsonText(config)));
      }
      drawWhere(data);
    }

    /// Where the queue runs: its system, its hosts' slots, a long queue's running tasks.
    function drawWhere(data) {
      const where = $('#queue-where');
      const hosts = Object.entries(data.hosts || {}).sort(([a], [b]) => a.localeCompare(b));
      where.replaceChildren(
        h('p', {}, 'system ', data.system ? link('#/systems', data.system, { id: 'queue-system' }) : h('span', { class: 'muted' }, 'none'),
          data.kind ? ` · kind ${data.kind}` : '', data.track === false ? ' · no records kept (track = false)' : ''),
        hosts.length ? h('table', { id: 'queue-hosts' },
          h('thead', {}, h('tr', {}, h('th', {}, 'host'), h('th', {}, 'state'), h('th', { class: 'num' }, 'slots running→in map'))),
          h('tbody', {}, hosts.map(([hn, x]) => h('tr', { dataset: { host: hn } },
            h('td', {}, hn), h('td', {}, badge(x.state)),
            h('td', { class: 'num' }, x.slots === x.mapped ? String(x.slots) : `${x.slots}→${x.mapped}`)))))
          : h('p', { class: 'muted' }, 'no slots on any host'),
        (data.long_running || []).length ? h('div', {}, h('h2', {}, 'Running long tasks'),
          h('ul', { id: 'queue-long' }, data.long_running.map((t) => h('li', {},
            link(`#/tasks/${enc(name)}/${enc(t.id)}`, t.id), ` on ${t.host}/${t.slot}`,
            t.since_ms ? ` for ${fmtAge(Date.now() - t.since_ms)}` : '')))) : null);
    }

    function taskRow(t) {
      return h('tr', { dataset: { task: t.id } },
        h('td', { class: 'id' }, link(`#/tasks/${enc(name)}/${enc(t.id)}`, t.id)),
        h('td', {}, badge(t.state)),
        h('td', { class: 'num' }, `${t.attempt}/${t.max_attempts || '∞'}`),
        h('td', { class: 'num' }, String(t.priority ?? 0)),
        h('td', {}, timeEl(t.created_at)),
        h('td', {}, timeEl(t.updated_at)),
        h('td', {}, t.submitted_by ?? '-'));
    }

    async function loadTasks() {
      const params = new URLSearchParams({ limit: '50' });
      if (list.state) params.set('state', list.state);
      if (list.cursor) params.set('cursor', list.cursor);
      const data = await get(`${qpath}/tasks?${params}`);
      const body = h('tbody', {}, (data.tasks || []).map(taskRow));
      if (!data.tasks || data.tasks.length === 0) {
        body.append(h('tr', {}, h('td', { colspan: 7, class: 'muted' },
          data.next_cursor ? 'none on this page (the listing looked at a part of the queue): go on' : 'no tasks')));
      }
      $('#tasks-table').tBodies[0].replaceWith(body);
      const next = $('#tasks-next');
      next.disabled = !data.next_cursor;
      next.dataset.cursor = data.next_cursor || '';
      $('#tasks-first').disabled = list.stack.length === 0;
      $('#tasks-page').textContent = `page ${list.stack.length + 1}`;
    }

    function deadRow(t) {
      const box = h('input', { type: 'checkbox', dataset: { deadSelect: t.id } });
      box.checked = dead.selected.has(t.id);
      box.addEventListener('change', () => {
        if (box.checked) dead.selected.add(t.id);
        else dead.selected.delete(t.id);
      });
      return h('tr', { dataset: { dead: t.id } },
        session.admin ? h('td', {}, box) : null,
        h('td', { class: 'id' }, link(`#/tasks/${enc(name)}/${enc(t.id)}`, t.id)),
        h('td', {}, timeEl(t.died_at)),
        h('td', { class: 'num' }, String(t.attempts ?? '-')),
        h('td', {}, h('span', { class: 'mono' }, (t.error || '').slice(0, 160))),
        h('td', {}, h('span', { class: 'mono' }, t.payload === undefined ? '' : JSON.stringify(t.payload).slice(0, 80))));
    }

    async function loadDead() {
      // Dead letters are an admin's: a limited key finds its failed tasks in the listing.
      if (!session.admin) return;
      const params = new URLSearchParams({ limit: '50' });
      if (dead.cursor) params.set('cursor', dead.cursor);
      let data;
      try {
        data = await get(`${qpath}/dead?${params}`);
      } catch (e) {
        if (e.status === 404 || e.status === 405) {
          $('#dead-section').hidden = true;
          return;
        }
        throw e;
      }
      const items = data.dead || [];
      const body = h('tbody', {}, items.map(deadRow));
      if (items.length === 0) body.append(h('tr', {}, h('td', { colspan: 6, class: 'muted' }, 'no dead letters')));
      $('#dead-table').tBodies[0].replaceWith(body);
      const next = $('#dead-next');
      next.disabled = !data.next_cursor;
      next.dataset.cursor = data.next_cursor || '';
      $('#dead-first').disabled = dead.stack.length === 0;
    }

    async function deadAction(button, verb, all) {
      const ids = [...dead.selected];
      if (!all && ids.length === 0) {
        showError('select dead letters first');
        return;
      }
      const what = all ? `every dead letter of ${name}` : `${ids.length} dead letter${ids.length > 1 ? 's' : ''} of ${name}`;
      const warn = verb === 'purge' ? ': they are deleted for good' : ': they go back to waiting';
      if (!(await confirmAction(`${verb === 'purge' ? 'Purge' : 'Requeue'} ${what}${warn}?`))) return;
      await act(button, (out) => (verb === 'purge' ? `purged ${out.purged}` : `requeued ${out.requeued}`), async () => {
        const out = await post(`${qpath}/dead/${verb}`, all ? { all: true } : { ids });
        dead.selected.clear();
        await loadDead();
        return out;
      });
    }

    function adminControls() {
      if (!session.admin) return null;
      const pause = h('button', { id: 'pause-btn', type: 'button' }, 'Pause');
      const resume = h('button', { id: 'resume-btn', type: 'button', hidden: true }, 'Resume');
      pause.addEventListener('click', () => act(pause, `paused ${name}`, () => post(`${qpath}/pause`)));
      resume.addEventListener('click', () => act(resume, `resumed ${name}`, () => post(`${qpath}/resume`)));
      const sel = h('select', { id: 'intake-select', 'aria-label': 'intake' },
        ['open', 'closed', 'cancel'].map((v) => h('option', { value: v }, v)),
        h('option', { value: '' }, "the config's"));
      sel.addEventListener('change', () => { sel.dataset.touched = '1'; });
      const apply = h('button', { id: 'intake-apply', type: 'button' }, 'Switch intake');
      apply.addEventListener('click', async () => {
        const value = sel.value || null;
        if (value && value !== 'open' &&
          !(await confirmAction(`Switch the intake of ${name} to ${value}? New tasks are ${value === 'closed' ? 'refused' : 'cancelled on arrival'}.`))) return;
        await act(apply, (out) => `intake of ${name}: ${out.intake}`, async () => {
          const out = await post(`${qpath}/intake`, { intake: value });
          delete sel.dataset.touched;
          return out;
        });
      });
      return h('div', { class: 'toolbar', id: 'queue-controls' }, pause, resume,
        h('span', { class: 'muted' }, 'intake'), sel, apply);
    }

    function deadControls() {
      if (!session.admin) return null;
      const b = (id, text, verb, all, cls) => {
        const el = h('button', { id, type: 'button', class: cls }, text);
        el.addEventListener('click', () => deadAction(el, verb, all));
        return el;
      };
      return [b('dead-requeue-selected', 'Requeue selected', 'requeue', false),
        b('dead-requeue-all', 'Requeue all', 'requeue', true),
        b('dead-purge-selected', 'Purge selected', 'purge', false, 'danger'),
        b('dead-purge-all', 'Purge all', 'purge', true, 'danger')];
    }

    function pager(prefix, state, load) {
      const first = h('button', { id: `${prefix}-first`, type: 'button', disabled: true }, 'First page');
      const next = h('button', { id: `${prefix}-next`, type: 'button', disabled: true }, 'Next page');
      first.addEventListener('click', () => {
        state.cursor = null;
        state.stack = [];
        load().catch(showError);
      });
      next.addEventListener('click', () => {
        if (!next.dataset.cursor) return;
        state.stack.push(state.cursor);
        state.cursor = next.dataset.cursor;
        load().catch(showError);
      });
      return [first, next];
    }

    return {
      name: 'queue',
      title: name,
      live: true,
      render(view) {
        const tabs = h('div', { class: 'tabs', id: 'state-tabs' },
          ['', ...TASK_STATES].map((s) => {
            const b = h('button', { type: 'button', dataset: { stateTab: s || 'all' }, class: s === list.state ? 'active' : '' }, s || 'all');
            b.addEventListener('click', () => {
              list.state = s;
              list.cursor = null;
              list.stack = [];
              for (const x of tabs.children) x.classList.toggle('active', x === b);
              loadTasks().catch(showError);
            });
            return b;
          }));
        const refreshList = h('button', { id: 'tasks-refresh', type: 'button' }, 'Refresh');
        refreshList.addEventListener('click', () => loadTasks().catch(showError));
        const deadHead = session.admin ? [h('th', {}, '')] : [];
        view.append(
          h('h1', {}, link('#/', 'Overview'), ' / ', h('span', { id: 'queue-name' }, name)),
          h('div', { class: 'panel' },
            h('div', { class: 'figures', id: 'queue-figures' }),
            h('p', { id: 'queue-state' }),
            adminControls()),
          h('h2', {}, 'Tasks'),
          h('div', { class: 'toolbar' }, tabs, h('span', { class: 'grow' }),
            h('span', { id: 'tasks-page', class: 'muted' }), ...pager('tasks', list, loadTasks), refreshList),
          h('div', { class: 'scroll panel' },
            h('table', { id: 'tasks-table' },
              h('thead', {}, h('tr', {}, ['id', 'state', 'attempt', 'prio', 'created', 'updated', 'submitted by']
                .map((c) => h('th', {}, c)))),
              h('tbody'))),
          h('section', { id: 'dead-section', hidden: !session.admin },
            h('h2', {}, 'Dead letters'),
            h('div', { class: 'toolbar' }, deadControls(), h('span', { class: 'grow' }), ...pager('dead', dead, loadDead)),
            h('div', { class: 'scroll panel' },
              h('table', { id: 'dead-table' },
                h('thead', {}, h('tr', {}, deadHead, ['id', 'died', 'attempts', 'error', 'payload'].map((c) => h('th', {}, c)))),
                h('tbody')))),
          h('div', { class: 'cols' },
            h('section', {}, h('h2', {}, 'Where it runs'), h('div', { class: 'panel', id: 'queue-where' })),
            h('section', {}, h('h2', {}, 'Config (as the manager sees it)'), h('div', { class: 'panel', id: 'queue-config' }))));
      },
      async refresh(current) {
        const data = await fetchQueue();
        if (!current()) return;
        drawFigures(data);
        if (!loadedLists) {
          loadedLists = true;
          await Promise.all([loadTasks(), loadDead()]);
        } else if (list.stack.length === 0 && !list.cursor && dead.stack.length === 0 && dead.selected.size === 0) {
          // Only the first pages follow the queue live; a later page stays as read.
          await Promise.all([loadTasks(), loadDead()]);
        }
      },
    };
  }

  // ---------------------------------------------------------------- task page

  function taskPage(queue, id) {
    const tpath = `/v1/queues/${enc(queue)}/tasks/${enc(id)}`;
    let rec = null;
    // The payload, read once: the queue holds it while the task lives, not the record.
    let payload;

    function field(label, key, value) {
      return [h('dt', {}, label), h('dd', { dataset: { field: key } }, value)];
    }

    function drawRecord() {
      $('#task-title').replaceChildren(h('span', { id: 'task-id' }, rec.id), ' ',
        badge(rec.state, { id: 'task-state' }));
      $('#task-fields').replaceChildren(h('dl', { class: 'fields' },
        field('queue', 'queue', link(`#/queues/${enc(rec.queue)}`, rec.queue)),
        field('state', 'state', rec.state ?? '-'),
        field('attempts', 'attempt', `${rec.attempt} of ${rec.max_attempts || 'no limit'}`),
        field('priority', 'priority', String(rec.priority ?? 0)),
        field('submitted by', 'submitted_by', rec.submitted_by ?? '-'),
        field('created', 'created_at', timeEl(rec.created_at)),
        field('due', 'due_at', timeEl(rec.due_at)),
        field('updated', 'updated_at', timeEl(rec.updated_at)),
        field('chain', 'chain', rec.chain ? link(`#/chains/${enc(rec.chain)}`, rec.chain, { id: 'task-chain' }) : '-')));
      const out = $('#task-output');
      out.replaceChildren();
      if (payload && payload.kept) {
        out.append(h('h2', {}, 'Payload'), h('pre', { class: 'json', id: 'task-payload' }, jsonText(payload.payload)));
      } else if (payload) {
        out.append(h('h2', {}, 'Payload'), h('p', { class: 'muted', id: 'task-payload' }, 'no longer kept: the queue drops it when the task ends'));
      }
      if (rec.result !== undefined && rec.result !== null) {
        out.append(h('h2', {}, 'Result'), h('pre', { class: 'json', id: 'task-result' }, jsonText(rec.result)));
      }
      if (rec.error) {
        // The last error stays on the record after a later attempt succeeded.
        const title = rec.state === 'failed' ? 'Error' : 'Last error (of an earlier attempt)';
        out.append(h('h2', {}, title), h('pre', { class: 'json error-text', id: 'task-error' }, rec.error));
      }
      drawHistory();
      drawActions();
    }

    function drawHistory() {
      const items = (rec.history || []).map((e) => {
        const where = e.host ? `${e.host}${e.slot !== null && e.slot !== undefined ? '/' + e.slot : ''}` : null;
        return h('li', { class: `tl-${e.state}`, dataset: { historyState: e.state } },
          badge(e.state), h('span', { class: 'when' }, timeEl(e.at)),
          h('span', { class: 'where' }, `attempt ${e.attempt}`, where ? ` · ${where}` : ''),
          e.count > 1 ? h('span', { class: 'muted' }, ` ×${e.count}`) : null,
          e.note ? h('span', { class: 'note' }, e.note) : null);
      });
      $('#task-history').replaceChildren(...(items.length ? items : [h('li', { class: 'muted' }, 'no history kept')]));
    }

    function actionButton(id, text, cls, confirmText, doneText, fn) {
      const b = h('button', { id, type: 'button', class: cls }, text);
      b.addEventListener('click', async () => {
        if (confirmText && !(await confirmAction(confirmText))) return;
        await act(b, doneText, fn);
      });
      return b;
    }

    function drawActions() {
      // The record is this key's to see, so it may act on it: cancel, freeze and thaw
      // are the submitter's; retry is offered on a failed task (the api decides who may).
      const s = rec.state;
      const buttons = [];
      if (s === 'waiting' || s === 'running' || s === 'frozen') {
        buttons.push(actionButton('task-cancel', 'Cancel', 'danger', `Cancel task ${rec.id} of ${queue}?`,
          `cancelled ${rec.id}`, () => api('DELETE', tpath)));
      }
      if (s === 'waiting') {
        buttons.push(actionButton('task-freeze', 'Freeze', '', null, `froze ${rec.id}`, () => post(`${tpath}/freeze`)));
      }
      if (s === 'frozen') {
        buttons.push(actionButton('task-thaw', 'Thaw', '', null, `thawed ${rec.id}`, () => post(`${tpath}/thaw`)));
      }
      if (s === 'failed') {
        buttons.push(actionButton('task-retry', 'Retry', 'primary', `Retry task ${rec.id} of ${queue}?`,
          `retried ${rec.id}`, () => post(`${tpath}/retry`)));
      }
      $('#task-actions').replaceChildren(...buttons);
    }

    return {
      name: 'task',
      title: `${queue}/${id}`,
      live: true,
      render(view) {
        view.append(
          h('h1', {}, link(`#/queues/${enc(queue)}`, queue), ' / ', h('span', { id: 'task-title' }, id)),
          h('div', { class: 'toolbar', id: 'task-actions' }),
          h('div', { class: 'cols' },
            h('section', {}, h('h2', {}, 'Record'), h('div', { class: 'panel', id: 'task-fields' }), h('div', { id: 'task-output' })),
            h('section', {}, h('h2', {}, 'History'),
              h('div', { class: 'panel' }, h('ol', { class: 'timeline', id: 'task-history' })))));
      },
      async refresh(current) {
        // Polled even once ended: a failed task may be retried or requeued meanwhile.
        const data = await get(tpath);
        if (!current()) return;
        if (payload === undefined) {
          try {
            payload = await get(`${tpath}/payload`);
          } catch (e) {
            // An api without the endpoint, or the task gone meanwhile: no payload shown.
            payload = null;
          }
          if (!current()) return;
        }
        rec = data;
        drawRecord();
      },
    };
  }

  // ---------------------------------------------------------------- chain page

  function chainPage(id) {
    let last = null;

    async function fetchChain() {
      // Follow the pages up to a bound: a tree of more than 5,000 tasks is cut.
      let cursor = null;
      let doc = null;
      const tasks = [];
      for (let i = 0; i < 10; i += 1) {
        const params = new URLSearchParams({ limit: '500' });
        if (cursor) params.set('cursor', cursor);
        doc = await get(`/v1/chains/${enc(id)}?${params}`);
        tasks.push(...(doc.tasks || []));
        cursor = doc.next_cursor;
        if (!cursor) break;
      }
      return { ...doc, tasks, cut: !!cursor };
    }

    function drawTree() {
      const key = (q, i) => `${q}\u0000${i}`;
      const children = new Map();
      const roots = [];
      const known = new Set(last.tasks.map((t) => key(t.queue, t.id)));
      for (const t of last.tasks) {
        const p = t.parent;
        if (p && known.has(key(p.queue, p.id))) {
          const k = key(p.queue, p.id);
          if (!children.has(k)) children.set(k, []);
          children.get(k).push(t);
        } else {
          roots.push(t);
        }
      }
      const node = (t, depth) => {
        const kids = depth < 64 ? children.get(key(t.queue, t.id)) || [] : [];
        return h('li', { dataset: { chainTask: `${t.queue}/${t.id}`, state: t.state ?? 'expired' } },
          h('span', { class: 'node' }, badge(t.state ?? 'expired'),
            link(`#/tasks/${enc(t.queue)}/${enc(t.id)}`, t.id),
            h('span', { class: 'muted' }, t.queue),
            t.attempt ? h('span', { class: 'muted' }, `attempt ${t.attempt}`) : null),
          kids.length ? h('ul', {}, kids.map((k) => node(k, depth + 1))) : null);
      };
      $('#chain-tree').replaceChildren(...roots.map((t) => node(t, 0)));
      $('#chain-head').replaceChildren('state ', badge(last.state ?? 'running', { id: 'chain-state' }),
        ` · ${last.tasks.length} task${last.tasks.length === 1 ? '' : 's'}`,
        last.cut ? ' (cut at 5,000)' : '');
      const failed = $('#chain-failed');
      if (last.failed) {
        failed.hidden = false;
        failed.replaceChildren('failed: ', link(`#/tasks/${enc(last.failed.queue)}/${enc(last.failed.id)}`, last.failed.id),
          ` of ${last.failed.queue}: `, h('span', { class: 'mono' }, last.failed.error ?? ''));
      } else {
        failed.hidden = true;
      }
    }

    return {
      name: 'chain',
      title: `chain ${id}`,
      live: true,
      render(view) {
        view.append(h('h1', {}, 'Chain ', h('span', { id: 'chain-id', class: 'mono' }, id)),
          h('p', { id: 'chain-head' }),
          h('p', { id: 'chain-failed', class: 'banner error', hidden: true }),
          h('div', { class: 'panel' }, h('ul', { class: 'tree', id: 'chain-tree' })));
      },
      async refresh(current) {
        // A chain that has ended changes no more.
        if (last && END_STATES.has(last.state)) return;
        const data = await fetchChain();
        if (!current()) return;
        last = data;
        drawTree();
      },
    };
  }

  // ---------------------------------------------------------------- hosts page

  function hostsPage() {
    const state = { all: false };
    let last = null;

    function slotCell(running, mapped) {
      if (running !== mapped) return h('td', { class: 'num differs', title: 'running→in map' }, `${running}→${mapped}`);
      if (running === 0) return h('td', { class: 'num zero' }, '·');
      return h('td', { class: 'num' }, String(running));
    }

    function draw() {
      const hosts = last.hosts || {};
      // Each host's share of the published map (`mapped`), as the dashboard shows it.
      const mapFor = (hst, q) => (hosts[hst] && hosts[hst].mapped && hosts[hst].mapped[q]) || 0;
      let names = Object.keys(last.queues || {}).sort();
      if (!state.all) {
        names = names.filter((q) => Object.entries(hosts).some(([hn, hst]) =>
          (hst.queues && hst.queues[q]) || mapFor(hn, q)));
      }
      const head = h('tr', {}, ['host', 'state', 'memory/budget', 'load/cpus', 'slots']
        .map((c, i) => h('th', { class: i >= 3 ? 'num' : '' }, c)),
      names.map((q) => h('th', { class: 'num', title: q, dataset: { queueCol: q } }, q.length > 14 ? q.slice(0, 13) + '…' : q)),
      session.admin ? h('th', {}, '') : null);
      const rows = Object.entries(hosts).sort(([a], [b]) => a.localeCompare(b)).map(([hn, hst]) => {
        const cells = names.map((q) => {
          const td = slotCell((hst.queues && hst.queues[q]) || 0, mapFor(hn, q));
          td.dataset.queue = q;
          return td;
        });
        let control = null;
        if (session.admin) {
          const draining = hst.draining || hst.drain_requested;
          const b = h('button', { type: 'button', dataset: draining ? { undrain: hn } : { drain: hn } },
            draining ? 'Undrain' : 'Drain');
          b.addEventListener('click', async () => {
            const verb = draining ? 'undrain' : 'drain';
            if (verb === 'drain' && !(await confirmAction(`Drain host ${hn}? Its slots finish the task in hand and move elsewhere.`))) return;
            await act(b, `${verb}ed ${hn}`, () => post(`/v1/hosts/${enc(hn)}/${verb}`));
          });
          control = h('td', {}, b);
        }
        return h('tr', { dataset: { host: hn }, class: hst.state === 'dead' ? 'dead-host' : '' },
          h('td', {}, hn), h('td', { dataset: { col: 'state' } }, hostState(hst)),
          h('td', {}, memoryEl(hst)),
          h('td', { class: 'num' }, loadText(hst)),
          h('td', { class: 'num', dataset: { col: 'slots' } }, slotsText(hst)),
          cells, control);
      });
      const live = Object.values(hosts).filter((x) => x.state !== 'dead');
      const foot = h('tr', {}, h('td', {}, 'total'), h('td'), h('td'), h('td'),
        h('td', { class: 'num' }, `${live.reduce((s, x) => s + hostSlots(x), 0)}/${live.reduce((s, x) => s + (x.capacity || 0), 0)}`),
        names.map((q) => {
          const v = last.queues[q] || {};
          return slotCell(v.slots || 0, v.mapped ?? v.slots ?? 0);
        }),
        session.admin ? h('td') : null);
      $('#slotmap').replaceChildren(h('thead', {}, head), h('tbody', {}, rows), h('tfoot', {}, foot));
      const m = last.manager;
      $('#slotmap-title').textContent = `slot map v${m ? m.map_version ?? 0 : '?'} · running→in map where they differ · ` +
        `${names.length} of ${Object.keys(last.queues || {}).length} queues · * drain requested`;
      $('#hosts-empty').hidden = Object.keys(hosts).length > 0;
    }

    return {
      name: 'hosts',
      title: 'slot map',
      live: true,
      render(view) {
        const all = h('input', { id: 'slotmap-all', type: 'checkbox' });
        all.addEventListener('change', () => {
          state.all = all.checked;
          if (last) draw();
        });
        view.append(h('h1', {}, 'Slot map and hosts'),
          h('div', { class: 'toolbar' }, h('span', { id: 'slotmap-title', class: 'muted' }), h('span', { class: 'grow' }),
            h('label', {}, all, ' every queue, not only those with slots')),
          h('p', { id: 'hosts-empty', class: 'muted', hidden: true }, 'no host reports (or none this key may see)'),
          h('div', { class: 'scroll panel' }, h('table', { id: 'slotmap' })));
      },
      async refresh(current) {
        const data = await fetchCluster();
        if (!current()) return;
        last = data;
        draw();
      },
    };
  }

  // ---------------------------------------------------------------- systems page

  function systemsPage() {
    let last = null;

    async function fetchSystems() {
      const cluster = await fetchCluster();
      return cluster.systems || {};
    }

    function controls(name, s) {
      if (!session.admin) return null;
      const button = (verb, cls, confirmText) => {
        const b = h('button', { type: 'button', class: cls, dataset: { systemAction: verb, system: name } },
          verb[0].toUpperCase() + verb.slice(1));
        b.addEventListener('click', async () => {
          if (confirmText && !(await confirmAction(confirmText))) return;
          await act(b, `${name}: ${verb}d`, () => post(`/v1/systems/${enc(name)}/${verb}`));
        });
        return b;
      };
      const st = s.state;
      return h('td', {},
        st === 'active' ? button('pause', '') : null,
        st === 'paused' ? button('resume', '') : null,
        st !== 'disabled' ? button('disable', 'danger',
          `Disable ${name}? Every waiting task of its queues is cancelled, and new ones are cancelled on arrival.`) : null,
        st === 'disabled' ? button('enable', '') : null);
    }

    function draw() {
      const rows = Object.entries(last).sort(([a], [b]) => a.localeCompare(b)).map(([name, s]) => {
        const cap = s.max_concurrency ?? s.max ?? null;
        return h('tr', { dataset: { system: name } },
          h('td', {}, name),
          h('td', { dataset: { col: 'state' } }, badge(s.state), s.switched ? h('span', { class: 'muted' }, ' (switched)') : null),
          h('td', { class: 'num' }, `${s.slots ?? 0}/${cap ?? '∞'}`),
          h('td', { class: 'num' }, s.rate != null ? `${s.rate}/s` : '-'),
          h('td', { class: 'num' }, fmtCount(s.started_total)),
          h('td', {}, (s.queues || []).map((q, i) => [i ? ', ' : '', link(`#/queues/${enc(q)}`, q)])),
          controls(name, s));
      });
      $('#systems-table').tBodies[0].replaceWith(h('tbody', {}, rows));
      $('#systems-empty').hidden = rows.length > 0;
    }

    return {
      name: 'systems',
      title: 'systems',
      live: true,
      render(view) {
        const cols = ['system', 'state', 'slots/max', 'rate cap', 'started', 'queues'];
        if (session.admin) cols.push('');
        view.append(h('h1', {}, 'External systems'),
          h('p', { id: 'systems-empty', class: 'muted', hidden: true }, 'no external systems configured (or none this key may see)'),
          h('div', { class: 'scroll panel' }, h('table', { id: 'systems-table' },
            h('thead', {}, h('tr', {}, cols.map((c) => h('th', {}, c)))), h('tbody'))));
      },
      async refresh(current) {
        const data = await fetchSystems();
        if (!current()) return;
        last = data;
        draw();
      },
    };
  }

  // ---------------------------------------------------------------- search

  function searchPage(id) {
    return {
      name: 'search',
      title: `search ${id}`,
      live: false,
      render(view) {
        $('#search-input').value = id;
        view.append(h('h1', {}, 'Task ', h('span', { class: 'mono' }, id)),
          h('ul', { id: 'search-results' }));
      },
      async refresh(current) {
        const out = $('#search-results');
        if (!id) {
          out.replaceChildren(h('li', { class: 'muted' }, 'give a task id'));
          return;
        }
        const data = await get(`/v1/tasks/${enc(id)}`);
        if (!current()) return;
        const found = data.found || [];
        out.replaceChildren(...(found.length ? found.map((f) => h('li', {},
          link(`#/tasks/${enc(f.queue)}/${enc(id)}`, `${f.queue} / ${id}`, { dataset: { found: f.queue } }),
          ' ', badge(f.state))) : [h('li', { id: 'search-none', class: 'muted' }, 'no task with this id in the queues this key may see')]));
      },
    };
  }

  function notFoundPage(hash) {
    return {
      name: 'notfound',
      live: false,
      render(view) {
        view.append(h('h1', {}, 'No such page'), h('p', {}, `${hash} is not a page of the console. `, link('#/', 'Overview')));
      },
      async refresh() {},
    };
  }

  // ---------------------------------------------------------------- start

  function startLogin() {
    if (new URLSearchParams(location.search).has('failed')) $('#login-failed').hidden = false;
  }

  async function startApp() {
    let s;
    try {
      const res = await fetch(ROOT + '/ui/session', { credentials: 'same-origin', headers: { Accept: 'application/json' } });
      if (res.status === 401) {
        location.assign(LOGIN);
        return;
      }
      if (!res.ok) throw new Error(`the session could not be read: ${res.status}`);
      s = await res.json();
    } catch (e) {
      showError(e);
      return;
    }
    Object.assign(session, s);
    document.body.classList.toggle('is-admin', !!session.admin);
    $('#session-key').textContent = session.user ? `${session.user} (key ${session.key})` : `key ${session.key}`;
    $('#session-admin').hidden = !session.admin;
    $('#logout').addEventListener('click', async () => {
      try {
        await api('POST', '/ui/logout');
      } catch (_) {
        // Gone already: the login page either way.
      }
      location.assign(LOGIN);
    });
    $('#search-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const id = $('#search-input').value.trim();
      if (id) location.hash = `#/search/${enc(id)}`;
    });
    window.addEventListener('hashchange', navigate);
    document.addEventListener('visibilitychange', tick);
    setInterval(tick, REFRESH_MS);
    await navigate();
  }

  document.addEventListener('DOMContentLoaded', () => {
    if (document.body.dataset.page === 'login') startLogin();
    else startApp();
  });
})();
