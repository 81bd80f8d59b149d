// Oxhorn's dashboard: pages are rendered by the manager; this script sends
// the changes a person asks for to the REST API (the session cookie and
// its CSRF token authenticate them), and keeps the page current as the
// cluster changes, without a reload. No framework, no build step.
'use strict';

const csrf = document.querySelector('meta[name="oxhorn-csrf"]')?.content ?? '';

/** Calls the API; resolves to its JSON answer, rejects with its message. */
async function call(method, path, body) {
  const init = { method, credentials: 'same-origin', headers: { 'X-Oxhorn-CSRF': csrf } };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let answer = {};
  try {
    answer = text ? JSON.parse(text) : {};
  } catch (_) {
    answer = {};
  }
  if (!response.ok) {
    throw new Error(answer.message || `${response.status} ${response.statusText}`);
  }
  return answer;
}

/** A form's fields as the API takes them; empty optional fields are left out. */
function fields(form) {
  const body = {};
  for (const input of form.querySelectorAll('[data-field]')) {
    const raw = input.value.trim();
    // An emptied list is a change too (no tags), and so is a field that
    // may be empty (a setting's value).
    if (raw === '' && input.dataset.kind !== 'list' && input.dataset.empty === undefined) continue;
    const kind = input.dataset.kind || 'text';
    let value = raw;
    if (kind === 'int') value = Number.parseInt(raw, 10);
    if (kind === 'bytes') {
      const unit = form.querySelector(`[data-unit-for="${input.dataset.field}"]`);
      value = Math.round(Number.parseFloat(raw) * Number(unit ? unit.value : 1));
    }
    if (kind === 'list') value = raw.split(',').map((s) => s.trim()).filter(Boolean);
    if (kind === 'bool') value = raw === 'true';
    body[input.dataset.field] = value;
  }
  return body;
}

/** Says `message` for a few seconds, where screen readers hear it too. */
function toast(message, failed) {
  const region = document.getElementById('toast');
  if (!region) return;
  region.textContent = message;
  region.className = failed ? 'toast failed shown' : 'toast shown';
  clearTimeout(region.timer);
  region.timer = setTimeout(() => { region.className = 'toast'; }, 4000);
}

document.addEventListener('submit', async (event) => {
  const form = event.target.closest('form[data-path]');
  if (!form) return;
  event.preventDefault();
  // What cannot be undone is asked for again.
  if (form.dataset.ask && !window.confirm(form.dataset.ask)) return;
  const error = form.querySelector('.error');
  const button = form.querySelector('button[type=submit]');
  if (error) error.textContent = '';
  button.disabled = true;
  button.setAttribute('aria-busy', 'true');
  try {
    const answer = await call(form.dataset.method || 'POST', form.dataset.path, fields(form));
    const dialog = form.closest('dialog');
    if (dialog) {
      dialog.close();
      form.reset();
    }
    if (form.dataset.then) {
      location.assign(form.dataset.then.replace('{name}', encodeURIComponent(answer.name || '')));
      return;
    }
    toast(form.dataset.done || 'Done');
    await refresh();
  } catch (e) {
    if (error) error.textContent = e.message;
    else toast(e.message, true);
  } finally {
    button.removeAttribute('aria-busy');
    button.disabled = form.querySelector('[data-confirm]') !== null;
  }
});

// A destructive action is enabled only once its object's name is typed;
// one on many volumes, once their number is (which a select-all made by
// mistake would not match).
function confirmedBulk(form) {
  const input = form.querySelector('[data-confirm-bulk]');
  return input === null || input.value.trim() === String(form.names.length);
}

document.addEventListener('input', (event) => {
  const input = event.target;
  const submit = input.form?.querySelector('button[type=submit]');
  if (input.dataset.confirm !== undefined) submit.disabled = input.value !== input.dataset.confirm;
  if (input.dataset.confirmBulk !== undefined) submit.disabled = !confirmedBulk(input.form);
});

// A bulk action under way is not hidden by Escape: it would go on out of
// sight, and a second could start beside it.
document.addEventListener('cancel', (event) => {
  if (event.target.querySelector?.('form[data-bulk][data-running]')) event.preventDefault();
}, true);

/** The names of the volumes selected in the table. */
function selected() {
  return [...document.querySelectorAll('input[data-select]:checked')].map((box) => box.value);
}

function volumes(n) {
  return n === 1 ? '1 volume' : `${n} volumes`;
}

/** Shows how many are selected; the actions on them need one. */
function showSelection() {
  const boxes = [...document.querySelectorAll('input[data-select]')];
  const chosen = boxes.filter((box) => box.checked).length;
  const count = document.getElementById('selected-count');
  if (count) count.textContent = chosen ? `${volumes(chosen)} selected` : 'None selected';
  for (const button of document.querySelectorAll('[data-needs-selection]')) button.disabled = chosen === 0;
  const all = document.querySelector('input[data-select-all]');
  if (all) {
    all.checked = chosen > 0 && chosen === boxes.length;
    all.indeterminate = chosen > 0 && chosen < boxes.length;
  }
}

document.addEventListener('change', (event) => {
  const box = event.target;
  if (box.matches('input[data-select-all]')) {
    for (const each of document.querySelectorAll('input[data-select]')) each.checked = box.checked;
  }
  if (box.matches('input[data-select-all], input[data-select]')) showSelection();
});

/** Readies a bulk action's dialog for the volumes selected now. */
function prepareBulk(form) {
  if (form.dataset.running !== undefined) return;
  form.names = selected();
  form.querySelector('[data-selection-count]').textContent = volumes(form.names.length);
  const items = form.names.map((name) => {
    const item = document.createElement('li');
    item.textContent = name;
    return item;
  });
  form.querySelector('[data-selection]').replaceChildren(...items);
  form.querySelector('[data-results]').replaceChildren();
  form.querySelector('.summary').textContent = '';
  const confirm = form.querySelector('[data-confirm-bulk]');
  if (confirm) confirm.value = '';
  const submit = form.querySelector('button[type=submit]');
  submit.hidden = false;
  submit.disabled = confirm !== null;
  form.querySelector('[data-close]').textContent = 'Cancel';
}

// A bulk action: the one volume's API call for each selected volume, one
// after another, each meeting the API's guards on its own; how each went
// is listed.
document.addEventListener('submit', async (event) => {
  const form = event.target.closest('form[data-bulk]');
  if (!form) return;
  event.preventDefault();
  if (form.dataset.running !== undefined || !confirmedBulk(form)) return;
  form.dataset.running = '';
  const submit = form.querySelector('button[type=submit]');
  const close = form.querySelector('[data-close]');
  const results = form.querySelector('[data-results]');
  submit.disabled = true;
  submit.setAttribute('aria-busy', 'true');
  close.disabled = true;
  const body = fields(form);
  let failed = 0;
  for (const name of form.names) {
    const item = document.createElement('li');
    const label = document.createElement('strong');
    const outcome = document.createElement('span');
    label.textContent = name;
    outcome.textContent = '…';
    item.dataset.result = name;
    item.append(label, ' ', outcome);
    results.append(item);
    try {
      await call(form.dataset.method, form.dataset.bulk.replace('{name}', encodeURIComponent(name)), body);
      item.dataset.outcome = 'done';
      outcome.textContent = form.dataset.done;
    } catch (e) {
      failed += 1;
      item.dataset.outcome = 'failed';
      outcome.textContent = e.message;
    }
  }
  const n = form.names.length;
  form.querySelector('.summary').textContent = failed ? `${n - failed} of ${n} done, ${failed} failed.` : `All ${n} done.`;
  delete form.dataset.running;
  submit.removeAttribute('aria-busy');
  submit.hidden = true;
  close.disabled = false;
  close.textContent = 'Close';
  close.focus();
});

document.addEventListener('click', (event) => {
  const opener = event.target.closest('[data-open]');
  if (opener) {
    const dialog = document.getElementById(opener.dataset.open);
    dialog.querySelector('.error')?.replaceChildren();
    const bulk = dialog.querySelector('form[data-bulk]');
    if (bulk) prepareBulk(bulk);
    dialog.showModal();
    return;
  }
  const closer = event.target.closest('[data-close]');
  if (closer) {
    closer.closest('dialog').close();
    return;
  }
  const header = event.target.closest('th[data-sort]');
  if (header) sortBy(header.closest('table'), header.cellIndex, true);
});

/** Sorts `table` by column `index`, flipping the order if asked again. */
function sortBy(table, index, flip) {
  const key = `sort:${location.pathname}:${table.id}`;
  const last = JSON.parse(sessionStorage.getItem(key) || 'null');
  let descending = false;
  if (flip && last && last.index === index) descending = !last.descending;
  if (!flip && last) descending = last.descending;
  sessionStorage.setItem(key, JSON.stringify({ index, descending }));
  const body = table.tBodies[0];
  const value = (row) => {
    const cell = row.cells[index];
    return cell.dataset.value ?? cell.textContent.trim();
  };
  const rows = [...body.rows].sort((a, b) => {
    const [x, y] = [value(a), value(b)];
    const numeric = x !== '' && y !== '' && !Number.isNaN(Number(x)) && !Number.isNaN(Number(y));
    const order = numeric ? Number(x) - Number(y) : x.localeCompare(y);
    return descending ? -order : order;
  });
  body.append(...rows);
  for (const th of table.tHead.rows[0].cells) th.removeAttribute('aria-sort');
  table.tHead.rows[0].cells[index].setAttribute('aria-sort', descending ? 'descending' : 'ascending');
}

function restoreSorting() {
  // Tables sorted by the server (a link per heading) have no data-sort.
  for (const table of document.querySelectorAll('table[id]:has(th[data-sort])')) {
    const last = JSON.parse(sessionStorage.getItem(`sort:${location.pathname}:${table.id}`) || 'null');
    if (last) sortBy(table, last.index, false);
  }
}

let pending = false;

/** Renders the page's content again, unless the person is in a dialog or
 * typing in a field of the page (it renders once they leave it). */
async function refresh() {
  if (busy()) {
    pending = true;
    return;
  }
  pending = false;
  const response = await fetch(location.href, {
    credentials: 'same-origin',
    headers: { 'X-Oxhorn-Part': 'main' },
  });
  if (response.status === 401 || response.redirected) {
    location.assign('/ui/signin');
    return;
  }
  if (!response.ok) return;
  const text = await response.text();
  // A dialog may have been opened while the page was asked for.
  if (busy()) {
    pending = true;
    return;
  }
  const kept = new Set(selected());
  document.querySelector('main').innerHTML = text;
  for (const box of document.querySelectorAll('input[data-select]')) box.checked = kept.has(box.value);
  showSelection();
  showLive();
  restoreSorting();
}

/** Whether the person is in a dialog or typing in a field of the page. */
function busy() {
  const focused = document.activeElement;
  const typing = focused?.closest('main') && focused.matches('input, select, textarea');
  return document.querySelector('dialog[open]') !== null || typing;
}

/** Whether the live stream is connected, shown on the page. */
let connected = null;

function showLive() {
  const status = document.getElementById('live');
  if (!status || connected === null) return;
  status.textContent = connected ? 'Live' : 'Reconnecting…';
  status.className = connected ? 'live on' : 'live off';
}

document.addEventListener('close', () => { if (pending) refresh(); }, true);
document.addEventListener('focusout', () => { if (pending) setTimeout(refresh, 0); });

let source = null;

function live() {
  source = new EventSource('/ui/live');
  let timer = null;
  source.addEventListener('changed', () => {
    // Changes come in bursts: one render for each.
    clearTimeout(timer);
    timer = setTimeout(refresh, 250);
  });
  source.onopen = () => { connected = true; showLive(); };
  source.onerror = () => { connected = false; showLive(); };
}

// A page left holds no stream: browsers allow a few connections to a host,
// and pages kept for going back would hold them all. One that comes back
// streams again, and catches up.
window.addEventListener('pagehide', () => source?.close());
window.addEventListener('pageshow', (event) => {
  if (event.persisted && document.querySelector('main[data-live]')) {
    live();
    refresh();
  }
});

restoreSorting();
showSelection();
if (document.querySelector('main[data-live]')) live();
