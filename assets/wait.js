"use strict";
(function () {
  const deal = decodeURIComponent(location.pathname.split("/").pop());
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get("token")) { sessionStorage.setItem("flashgate-token", hash.get("token")); history.replaceState(null, "", location.pathname + location.search); }
  const token = sessionStorage.getItem("flashgate-token");
  const base = "/v1/deals/" + encodeURIComponent(deal) + "/queue";
  const $ = (id) => document.getElementById(id);
  // The buyer's language, chosen by the gateway (Accept-Language, or `?lang=`), and its
  // catalogue: every word the script says comes from it, numbers and times are written
  // the buyer's way.
  const locale = document.documentElement.lang || "en";
  const words = JSON.parse($("flashgate-i18n").textContent);
  const number = new Intl.NumberFormat(locale);
  const percent = new Intl.NumberFormat(locale, { style: "percent", maximumFractionDigits: 0 });
  const time = new Intl.DateTimeFormat(locale, { hour: "numeric", minute: "2-digit", second: "2-digit" });
  const plural = new Intl.PluralRules(locale);
  // The catalogue's text for `key` with `{name}` filled from `vars` (numbers formatted); an
  // entry with plural forms takes the form of `vars.n` (or `vars.start`).
  function t(key, vars) {
    vars = vars || {};
    let text = words[key];
    if (typeof text === "object") {
      const count = vars.n !== undefined ? vars.n : vars.start;
      text = text[plural.select(count)] || text.other;
    }
    return String(text).replace(/\{(\w+)\}/g, (_, name) =>
      typeof vars[name] === "number" ? number.format(vars[name]) : String(vars[name]));
  }
  // Every element showing the live part `name` (a deal's own template may show it several
  // times, or not at all); elements the page lacks are skipped.
  const live = (name, text) => { for (const e of document.querySelectorAll('[data-live="' + name + '"]')) e.textContent = text; };
  const hide = (id, hidden) => { const e = $(id); if (e) e.hidden = hidden; };
  const say = (text, state) => { live("status", text); document.body.dataset.state = state || "busy"; };
  const auth = () => ({ "Authorization": "Bearer " + token });
  // The ticket shown, its signed position, the line's counter as last seen, whether its pass
  // was seen (so an expiry is the pass's), and the one timer that moves the page on: the
  // next read of the line, the next poll of the ticket, or the pass's countdown.
  const current = { ticket: null, token: null, through: 0, admitted: false, timer: 0 };
  // The signed position is kept for the tab's session: shown back, it re-joins the line
  // without a new proof of work after a reload.
  const kept = "flashgate-position-" + deal;
  const position = () => current.token || sessionStorage.getItem(kept);
  const shown = () => position() ? { "Flashgate-Position": position() } : {};
  // The position the ticket's signed token carries (the page only reads it; the gateway
  // checks the signature), whether the shuffle of a random-order line can still move it,
  // and whether it is a place in the priority group's line, which counts its places apart.
  function signed(token) {
    const body = token.split(".")[0].replace(/-/g, "+").replace(/_/g, "/");
    const p = JSON.parse(atob(body));
    return { position: p.p, final: p.f, priority: p.g === true };
  }
  // The line the signed place is in, as the public state shows it: `admitted_through` of
  // the ticket's group, and how many wait in the other group's line (none without groups).
  function group(mine, line) {
    const p = line.priority;
    if (!p) return { through: line.admitted_through, share: 0, other: 0 };
    return mine.priority
      ? { through: p.admitted_through, share: p.share_percent, other: line.waiting - p.waiting }
      : { through: line.admitted_through, share: 100 - p.share_percent, other: p.waiting };
  }
  // The tickets admitted before this one: those ahead in its line, and the other line's
  // share of the admissions until its turn, at most those waiting there now (as the
  // gateway counts them for a ticket answer).
  function before(ahead, g) {
    if (g.share === 0) return ahead;
    return ahead + Math.min(g.other, Math.ceil((ahead + 1) * (100 - g.share) / g.share));
  }
  function minutes(s) { return s < 60 ? t("eta_under_minute") : t("eta_minutes", { n: Math.round(s / 60) }); }
  function clock(ms) {
    const s = Math.ceil(ms / 1000);
    return s < 60 ? t("clock_seconds", { s: s }) : t("clock_minutes", { m: Math.floor(s / 60), s: s % 60 });
  }
  async function solve(challenge, bits) {
    const enc = new TextEncoder();
    for (let n = 0; ; n++) {
      const h = new Uint8Array(await crypto.subtle.digest("SHA-256", enc.encode(challenge + ":" + n)));
      let z = 0;
      for (const b of h) { if (b === 0) { z += 8; continue; } z += Math.clz32(b) - 24; break; }
      if (z >= bits) return n;
    }
  }
  async function join() {
    let r = await fetch(base, { method: "POST", headers: Object.assign(auth(), shown()) });
    if (r.status === 403 && (await r.clone().json()).type.endsWith("/challenge-required")) {
      say(t("checking_browser"));
      const c = await (await fetch(base + "/challenge", { headers: auth() })).json();
      const nonce = await solve(c.challenge, c.difficulty_bits);
      r = await fetch(base, { method: "POST", headers: Object.assign(auth(), { "Flashgate-Pow": c.challenge + ":" + nonce }) });
    }
    return r;
  }
  // How far the buyer has come since joining: the people ahead at the first sight of the
  // ticket (kept across reloads) against those still ahead, the buyer's own turn last.
  function progress(t_) {
    hide("progress", t_.state === "expired");
    if (t_.state === "expired") return;
    const key = "flashgate-ahead-" + t_.ticket;
    const waiting = t_.state !== "admitted";
    const start = Math.max(Number(sessionStorage.getItem(key)) || 0, waiting ? t_.ahead : 0);
    sessionStorage.setItem(key, String(start));
    const done = waiting ? start - t_.ahead : start + 1;
    const share = Math.round(100 * done / (start + 1));
    const text = !waiting ? t("progress_done") : start === 0 ? t("progress_front") :
      t("progress_moved", { done: done, start: start });
    const line = t("progress_text", { percent: percent.format(share / 100), text: text });
    const bar = $("bar");
    if (bar) {
      bar.setAttribute("aria-valuenow", String(share));
      bar.setAttribute("aria-valuetext", line);
    }
    if ($("fill")) $("fill").style.width = share + "%";
    live("progress", line);
  }
  // A personal answer: shown, then the line is followed on its public state, or, near the
  // front (within the check-in window), the ticket is polled again.
  function show(t_) {
    clearTimeout(current.timer);
    if (t_.ticket !== current.ticket) { current.ticket = t_.ticket; current.admitted = false; }
    current.token = t_.position_token;
    current.through = t_.admitted_through;
    sessionStorage.setItem(kept, t_.position_token);
    render(t_);
    if (t_.state !== "waiting" && t_.state !== "sold_out") return;
    const near = t_.position_final && t_.position - t_.admitted_through <= t_.checkin_window_tickets;
    current.timer = setTimeout(near ? poll : follow, t_.refresh_after_seconds * 1000);
  }
  // Far from the front the page reads only the public line state, the same for everyone
  // as far back (its distance rounded down to a power of two, so the CDN keeps a few
  // answers per line) and cached by the CDN, and compares it with the signed position; it
  // reads again after the `refresh_after_seconds` that answer gives, longer the further
  // back, and checks in (polls the ticket) once the line is within the check-in window, or
  // once a random-order line was shuffled while the position was provisional.
  async function follow() {
    const far = Math.max(signed(current.token).position - current.through, 0);
    const bucket = far < 1 ? 0 : Math.min(2 ** Math.floor(Math.log2(far)), 2 ** 40);
    const r = await fetch(base + "?behind=" + bucket).catch(() => null);
    if (!r || !r.ok) { say(t("lost_contact")); current.timer = setTimeout(follow, 2000); return; }
    const line = await r.json();
    const mine = signed(current.token);
    const g = group(mine, line);
    current.through = g.through;
    const behind = mine.position - g.through;
    if (mine.final ? behind <= line.checkin_window_tickets : Boolean(line.seed)) { poll(); return; }
    const ahead = Math.max(behind - 1, 0);
    const first = before(ahead, g);
    const rate = Math.max(line.admit_per_second, 1);
    const left = line.units_left;
    render({ ticket: current.ticket, position: mine.position, ahead: ahead,
      state: line.state === "sold_out" ? "sold_out" : "waiting",
      estimated_wait_seconds: Math.ceil((first + 1) / rate), units_left: left,
      chance_of_units: left === undefined ? undefined : Math.min(left / (first + 1), 1),
      likely_sold_out: left !== undefined && first >= left });
    current.timer = setTimeout(follow, line.refresh_after_seconds * 1000);
  }
  function render(t_) {
    hide("figures", false);
    live("position", number.format(t_.position));
    live("ahead", number.format(t_.ahead));
    live("eta", t_.state === "waiting" ? minutes(t_.estimated_wait_seconds) : "–");
    live("units_left", t_.units_left === undefined ? "–" : number.format(t_.units_left));
    live("odds", t_.chance_of_units === undefined ? "–" :
      (t_.likely_sold_out ? t("odds_sold_out") : t("odds_chance", { percent: percent.format(t_.chance_of_units) })));
    progress(t_);
    for (const id of ["countdown", "next", "api", "rejoin"]) hide(id, true);
    if (t_.state === "waiting") say(t("waiting", { n: t_.ahead }), "waiting");
    else if (t_.state === "admitted") admitted(t_);
    else if (t_.state === "sold_out") say(t("sold_out"), "sold_out");
    else expired();
  }
  function admitted(t_) {
    current.admitted = true;
    const until = time.format(new Date(t_.pass_expires_at));
    if (t_.checkout_url) {
      say(t("turn_checkout", { time: until }), "admitted");
      const url = t_.checkout_url + "#pass=" + encodeURIComponent(t_.pass);
      if ($("checkout")) $("checkout").href = url;
      hide("next", false);
      setTimeout(() => location.assign(url), 3000);
    } else {
      say(t("turn_api", { time: until }), "admitted");
      if ($("api-request")) $("api-request").textContent = "POST /v1/deals/" + encodeURIComponent(deal) + "/orders";
      live("pass", t_.pass);
      hide("api", false);
    }
    countdown(performance.now() + t_.pass_expires_in_ms, until);
  }
  // Counts down on the page's monotonic clock from the gateway's remaining lifetime, so a
  // wrong clock on the buyer's device cannot stretch or cut the pass; at zero the ticket is
  // polled, and the gateway says it has expired.
  function countdown(deadline, until) {
    const left = deadline - performance.now();
    if (left <= 0) { poll(); return; }
    live("countdown", t("countdown", { left: clock(left), time: until }));
    hide("countdown", false);
    current.timer = setTimeout(() => countdown(deadline, until), Math.min(1000, left % 1000 || 1000));
  }
  function expired() {
    if (current.admitted) say(t("pass_expired"), "expired");
    else say(t("turn_passed"), "expired");
    hide("rejoin", false);
  }
  async function poll() {
    const r = await fetch(base + "/" + current.ticket, { headers: Object.assign(auth(), shown()) });
    if (!r.ok) { say(t("lost_contact")); current.timer = setTimeout(poll, 2000); return; }
    show(await r.json());
  }
  // A join answered busy (429, 503) or not answered at all is tried again after the
  // `Retry-After` it names (1 to 30 s, else 2), as the polls are; other refusals are final.
  const busy = (r) => !r || r.status === 429 || r.status === 503;
  const after = (r) => 1000 * Math.min(30, Math.max(1, Number(r && r.headers.get("Retry-After")) || 2));
  async function start() {
    if (!token) { say(t("no_token")); return; }
    const before = current.ticket;
    const r = await join().catch(() => null);
    if (busy(r)) {
      say(t("lost_contact"));
      clearTimeout(current.timer);
      current.timer = setTimeout(() => start().catch(() => say(t("went_wrong"))), after(r));
      return;
    }
    if (!r.ok) { const p = await r.json().catch(() => ({})); say(p.detail || t("not_open")); return; }
    const t_ = await r.json();
    if (before !== null && t_.ticket === before && t_.state === "expired") {
      say(t("cannot_rejoin"), "expired");
      return;
    }
    show(t_);
  }
  if ($("again")) {
    $("again").addEventListener("click", () => {
      hide("rejoin", true);
      say(t("joining"));
      start().catch(() => say(t("went_wrong")));
    });
  }
  start().catch(() => say(t("went_wrong")));
})();
