// iblab ui: the course's page. Plain script, no framework, nothing fetched from elsewhere.
// Words come from the server's catalog (see t below); what a lab says comes from the lab.
'use strict';

const boot = JSON.parse(document.getElementById('boot').textContent);
const W = boot.words;
const lang = W.lang;

function t(key, vars) {
  let s = W[key] !== undefined ? W[key] : key;
  for (const k in vars || {}) s = s.replace('{' + k + '}', vars[k]);
  return s;
}

// An element; string children become text (never HTML).
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of kids.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

async function api(path, opts) {
  const sep = path.includes('?') ? '&' : '?';
  const r = await fetch(path + sep + 'lang=' + lang.split('-')[0], Object.assign({
    credentials: 'same-origin',
    headers: { 'content-type': 'application/json' },
  }, opts || {}));
  const text = await r.text();
  if (!r.ok) throw new Error(text.trim());
  return JSON.parse(text);
}

const state = {
  lessons: [],
  lab: null,
  scenario: 'default',
  switches: {},
  edits: {},
  backend: boot.backend,
  view: null,
  runs: [],
  picked: [],
  message: '',
};

const pathName = { tcp: t('path_tcp'), roce: t('path_roce'), ib: t('path_ib') };
const pathAbout = { tcp: t('about_tcp'), roce: t('about_roce'), ib: t('about_ib') };

function fmt(v, digits) {
  if (typeof v !== 'number') return v === undefined || v === null ? '—' : String(v);
  if (Math.abs(v) >= 100 || Number.isInteger(v)) return v.toFixed(0);
  return v.toFixed(digits === undefined ? 2 : digits);
}

function verdictBadge(v) {
  return el('span', { class: 'verdict v-' + v, 'data-verdict': v }, W['v_' + v] || v);
}

// ---- the lessons ----

function lessonOf(name) {
  return state.lessons.find(l => l.name === name);
}

function renderLessons() {
  const nav = document.getElementById('lessons');
  nav.replaceChildren(el('h2', {}, t('lessons')));
  let last;
  for (const l of state.lessons) {
    const group = l.lesson ? t('lesson_n', { n: l.lesson }) : t('more_labs');
    if (group !== last) {
      nav.append(el('h3', {}, group));
      last = group;
    }
    nav.append(el('button', {
      class: 'lab' + (state.lab === l.name ? ' on' : ''),
      'data-lab': l.name,
      onclick: () => pick(l.name),
    }, el('b', {}, l.name), el('span', {}, l.title)));
  }
}

function pick(name) {
  state.lab = name;
  state.scenario = 'default';
  state.switches = {};
  state.edits = {};
  renderLessons();
  renderLesson();
  renderHistory();
}

function scenarioOf(l) {
  return l.scenarios.find(s => s.name === state.scenario) || l.scenarios[0];
}

// The scenario a run uses: the picked one, or the one a switch turned on.
function effective(l) {
  const s = scenarioOf(l);
  for (const f of l.switches) {
    if (state.switches[f] && s.on[f]) return { name: s.on[f], params: s.params['on:' + f] };
  }
  return { name: s.name, params: s.params.off };
}

function renderLesson() {
  const box = document.getElementById('lesson');
  const l = lessonOf(state.lab);
  if (!l) { box.replaceChildren(); return; }
  const eff = effective(l);
  const busy = state.view && (state.view.verdict === 'running' || state.view.verdict === 'stopping');
  const scenarios = el('fieldset', { class: 'scenarios' }, el('legend', {}, t('scenario')),
    l.scenarios.map(s => el('label', { class: 'scenario' },
      el('input', {
        type: 'radio', name: 'scenario', value: s.name, checked: s.name === state.scenario,
        onchange: () => { state.scenario = s.name; state.edits = {}; renderLesson(); },
      }),
      el('b', {}, s.name === 'default' ? t('scenario_default') : s.name),
      s.description ? el('span', { class: 'sub' }, ' · ' + s.description) : null)));
  const switches = l.switches.length ? el('fieldset', { class: 'switches' }, el('legend', {}, t('switches')),
    l.switches.map(f => {
      const can = !!scenarioOf(l).on[f];
      return el('label', { class: 'switch' + (can ? '' : ' off') },
        el('input', {
          type: 'checkbox', id: 'switch-' + f, disabled: !can, checked: !!state.switches[f],
          onchange: e => { state.switches[f] = e.target.checked; state.edits = {}; renderLesson(); },
        }),
        el('span', { class: 'knob' }),
        el('b', {}, W['switch_' + f] || f),
        el('span', { class: 'sub' }, ' ' + (state.switches[f] ? t('on') : t('off')) + ' · ' + eff.name));
    })) : null;
  const params = Object.keys(eff.params || {}).length ? el('fieldset', { class: 'params' }, el('legend', {}, t('params')),
    Object.entries(eff.params).map(([k, v]) => el('label', { class: 'param' },
      el('span', {}, W['param_' + k] || k),
      el('input', {
        name: k, id: 'param-' + k, value: state.edits[k] !== undefined ? state.edits[k] : String(v), size: 8,
        oninput: e => { state.edits[k] = e.target.value; },
      })))) : null;
  const backend = el('label', { class: 'backend' }, t('backend') + ' ',
    el('select', { id: 'backend', onchange: e => { state.backend = e.target.value; } },
      boot.backends.map(b => el('option', { value: b, selected: b === state.backend }, b))));
  const run = el('button', { id: 'run', class: 'primary', disabled: busy, onclick: () => start(l, eff) }, t('run'));
  const stop = el('button', { id: 'stop', disabled: !busy, onclick: stopRun }, t('stop'));
  box.replaceChildren(
    el('h2', {}, (l.lesson ? t('lesson_n', { n: l.lesson }) + ' · ' : '') + l.title),
    el('p', { class: 'goal' }, el('b', {}, t('goal') + ' '), l.goal),
    el('div', { class: 'controls' }, scenarios, switches, params),
    el('div', { class: 'actions' }, backend, run, stop,
      state.message ? el('span', { class: 'message', id: 'message' }, state.message) : null));
}

async function start(l, eff) {
  const set = {};
  for (const [k, v] of Object.entries(state.edits)) {
    if (String(eff.params[k]) !== v && v !== '') set[k] = v;
  }
  state.message = '';
  try {
    await api('/api/run', {
      method: 'POST',
      body: JSON.stringify({ lab: l.name, scenario: eff.name, backend: state.backend, set }),
    });
  } catch (e) {
    state.message = t('could_not_start') + ': ' + e.message;
  }
  renderLesson();
}

async function stopRun() {
  try { await api('/api/stop', { method: 'POST', body: '{}' }); } catch (e) { state.message = e.message; }
}

// ---- a run ----

function steps(v) {
  return el('table', { class: 'steps' },
    v.steps.map(s => el('tr', { class: 'step v-' + s.verdict, 'data-step': s.id, 'data-path': s.path || '' },
      el('td', {}, verdictBadge(s.verdict)),
      el('td', {}, s.mark ? s.mark + ' ' : '', el('b', {}, s.id), s.name ? el('span', { class: 'sub' }, ' ' + s.name) : null),
      el('td', { class: 'num' }, fmt(s.duration_s) + ' s'),
      el('td', { class: 'num' }, s.throughput_mbps !== null && s.throughput_mbps !== undefined ? fmt(s.throughput_mbps) + ' Mbit/s' : ''),
      el('td', { class: 'reason' }, s.reason || ''))));
}

function retention(v) {
  if (!v.retention || !v.retention.length) return null;
  return el('div', { class: 'retention' },
    el('h3', {}, t('retention')),
    el('p', { class: 'note' }, t('retention_note')),
    el('table', {}, v.retention.map(r => el('tr', { 'data-path': r.path, 'data-share': r.share },
      el('td', {}, pathName[r.path]),
      el('td', { class: 'num share' }, fmt(r.share * 100, 1) + '%'),
      el('td', { class: 'sub' }, r.step + ' · ' + r.of)))));
}

function comparison(v) {
  if (!v.comparison || !v.comparison.length) return null;
  const rows = [];
  let group;
  for (const r of v.comparison) {
    if (r.group !== group) {
      group = r.group;
      rows.push(el('tr', { class: 'group' }, el('td', { colspan: 4 }, t(group))));
    }
    const cls = r.same === true ? 'same' : r.same === false ? 'differ' : '';
    rows.push(el('tr', { class: 'row ' + cls, title: r.rule },
      el('td', {}, r.name, r.unit ? el('span', { class: 'sub' }, ' ' + r.unit) : null),
      r.cells.map(c => el('td', { class: 'cell', title: c.full || null },
        c.full && c.full !== c.short
          ? el('details', {}, el('summary', {}, c.short), el('div', { class: 'full' }, c.full))
          : c.short))));
  }
  return el('div', { class: 'comparison' },
    el('h3', {}, t('comparison')),
    el('p', { class: 'note' }, t('grey_green')),
    el('table', {}, el('tr', {}, el('th', {}, t('row')), ['tcp', 'roce', 'ib'].map(p => el('th', {}, pathName[p]))), rows));
}

function expectations(v) {
  if (!v.expectations || !v.expectations.length) return null;
  return el('div', { class: 'expectations' },
    el('h3', {}, t('expectations')),
    el('ul', {}, v.expectations.map(x => el('li', { class: 'v-' + x.verdict, 'data-expectation': x.id },
      verdictBadge(x.verdict), ' ', el('b', {}, x.id), ' ',
      x.paths && x.paths.length ? el('span', { class: 'sub' }, x.paths.map(p => ({ tcp: '①', roce: '②', ib: '③' })[p]).join('')) : null,
      el('p', {}, x.explanation),
      el('details', {}, el('summary', {}, t('expression')), el('code', {}, x.expression))))));
}

// A run's whole view into `box`.
function renderRun(box, v, compact) {
  if (!v || v.idle) { box.replaceChildren(); return; }
  const graphs = el('div', { class: 'graphs' });
  // The graphs are SVG drawn by iblab itself (the report's drawing), text escaped there.
  if (v.graphs) graphs.innerHTML = v.graphs;
  const params = v.params ? Object.entries(v.params).map(([k, x]) => k + '=' + x).join(' ') : '';
  box.replaceChildren(...[

    el('div', { class: 'run-head' },
      verdictBadge(v.verdict), ' ',
      el('b', {}, (v.lab || '') + ' · ' + (v.scenario || '')),
      el('span', { class: 'sub' }, ' ' + (v.backend || '') + ' · ' + params + ' · ' + (v.name || '')),
      v.report ? el('a', { href: v.report, target: '_blank', class: 'report' }, t('report')) : null),
    v.stage && (v.verdict === 'running' || v.verdict === 'stopping')
      ? el('p', { class: 'stage', id: compact ? null : 'stage' }, t('now') + ': ', v.verdict === 'stopping' ? t('stopping') : v.stage)
      : null,
    v.graphs ? el('h3', {}, t('graphs')) : null,
    v.graphs && !compact ? el('p', { class: 'note' }, t('graphs_note')) : null,
    graphs,
    retention(v),
    compact ? null : comparison(v),
    expectations(v),
    compact ? null : el('details', { class: 'steps-box', open: v.verdict === 'running' }, el('summary', {}, t('steps')), steps(v)),
    v.console ? el('details', { class: 'console', open: true }, el('summary', {}, t('console')), el('pre', {}, v.console)) : null,
    !compact && v.notes && v.notes.length ? el('details', { class: 'notes' }, el('summary', {}, t('notes')), v.notes.map(n => el('p', { class: 'note' }, n))) : null,
  ].filter(Boolean));
}

let lastVerdict;
function onView(v) {
  const before = state.view && state.view.verdict;
  state.view = v;
  renderRun(document.getElementById('live'), v, false);
  const busy = v.verdict === 'running' || v.verdict === 'stopping';
  if (before !== v.verdict || lastVerdict === undefined) renderLesson();
  lastVerdict = v.verdict;
  if (before && (before === 'running' || before === 'stopping') && !busy) loadRuns();
}

function follow() {
  const es = new EventSource('/api/live?lang=' + lang.split('-')[0]);
  es.onmessage = e => onView(JSON.parse(e.data));
}

// ---- runs, and two side by side ----

async function loadRuns() {
  try { state.runs = await api('/api/runs'); } catch (e) { state.runs = []; }
  state.picked = state.picked.filter(n => state.runs.some(r => r.name === n));
  renderHistory();
}

function renderHistory() {
  const box = document.getElementById('history');
  const mine = state.runs.filter(r => !state.lab || r.lab === state.lab);
  const rows = mine.map(r => {
    const roce = (r.retention || []).filter(x => x.path === 'roce').map(x => '② ' + fmt(x.share * 100, 1) + '%').join(' ');
    const params = Object.entries(r.params || {}).map(([k, x]) => k + '=' + x).join(' ');
    return el('tr', { 'data-run': r.name },
      el('td', {}, el('input', {
        type: 'checkbox', class: 'pick', value: r.name, checked: state.picked.includes(r.name),
        onchange: e => {
          state.picked = state.picked.filter(n => n !== r.name);
          if (e.target.checked) state.picked.push(r.name);
          while (state.picked.length > 2) state.picked.shift();
          renderHistory();
        },
      })),
      el('td', {}, verdictBadge(r.verdict)),
      el('td', {}, el('b', {}, r.lab), ' · ', r.scenario),
      el('td', { class: 'sub' }, params),
      el('td', { class: 'num' }, roce),
      el('td', { class: 'sub' }, r.started),
      el('td', {}, el('a', { href: 'runs/' + r.name + '/report.html', target: '_blank' }, t('report'))));
  });
  box.replaceChildren(
    el('h2', {}, t('history')),
    el('p', { class: 'note' }, t('pick_two')),
    mine.length ? el('table', { class: 'runs' }, rows) : el('p', { class: 'sub' }, t('no_runs')),
    el('button', { id: 'compare-button', disabled: state.picked.length !== 2, onclick: compare }, t('compare')));
}

async function compare() {
  const box = document.getElementById('compare');
  const [a, b] = await Promise.all(state.picked.map(n => api('/api/runs/' + encodeURIComponent(n))));
  const colA = el('div', { class: 'col', id: 'run-a' });
  const colB = el('div', { class: 'col', id: 'run-b' });
  renderRun(colA, a, true);
  renderRun(colB, b, true);
  // The retention of each path, one beside the other.
  const share = (v, p, step) => (v.retention || []).find(r => r.path === p && r.step === step);
  const keys = [];
  for (const r of (a.retention || []).concat(b.retention || [])) {
    if (!keys.some(k => k.path === r.path && k.step === r.step)) keys.push({ path: r.path, step: r.step });
  }
  const diff = keys.length ? el('table', { class: 'retention-diff' },
    el('tr', {}, el('th', {}, t('retention')), el('th', {}, t('run_a') + ': ' + a.scenario), el('th', {}, t('run_b') + ': ' + b.scenario)),
    keys.map(k => {
      const x = share(a, k.path, k.step), y = share(b, k.path, k.step);
      return el('tr', { 'data-path': k.path, 'data-a': x ? x.share : '', 'data-b': y ? y.share : '' },
        el('td', {}, pathName[k.path] + ' · ' + k.step),
        el('td', { class: 'num' }, x ? fmt(x.share * 100, 1) + '%' : '—'),
        el('td', { class: 'num' }, y ? fmt(y.share * 100, 1) + '%' : '—'));
    })) : null;
  box.hidden = false;
  box.replaceChildren(...[
    el('h2', {}, t('compare'), ' ', el('button', { onclick: () => { box.hidden = true; } }, t('close'))),
    diff,
    el('div', { class: 'side-by-side' }, colA, colB),
  ].filter(Boolean));
  box.scrollIntoView();
}

// ---- start ----

function legend() {
  const box = document.getElementById('legend');
  box.replaceChildren(...['tcp', 'roce', 'ib'].map(p => el('span', { class: 'p-' + p, title: pathAbout[p] }, pathName[p])));
  const other = document.getElementById('lang');
  other.textContent = t('other_lang');
  other.href = '/?lang=' + t('other_lang_code');
}

async function main() {
  legend();
  state.lessons = await api('/api/lessons');
  state.lab = state.lessons.length ? state.lessons[0].name : null;
  renderLessons();
  renderLesson();
  await loadRuns();
  follow();
}

main();
