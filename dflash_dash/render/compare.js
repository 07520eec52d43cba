(function () {
  var root = document.currentScript && document.currentScript.closest('.dfcmp');
  if (!root) return;
  var panes = Array.prototype.slice.call(root.querySelectorAll('.dfv'), 0, 2);
  if (panes.length < 2) return;
  var toks = panes.map(function (p) {
    return Array.prototype.filter.call(p.children, function (e) {
      return e.tagName === 'SPAN' && !e.classList.contains('dfv-rej'); });
  });
  var n = Math.min(toks[0].length, toks[1].length), p0 = parseInt(root.dataset.p0 || '0', 10);
  if (!n) return;
  var diffs = [];
  for (var i = 0; i < n; i++) if (toks[0][i].classList.contains('dfv-x')) diffs.push(i);
  function y(s, i) {  // top of token i in pane s, in the pane's scroll coordinates
    return toks[s][i].getBoundingClientRect().top - panes[s].getBoundingClientRect().top + panes[s].scrollTop;
  }
  function top(s) {  // the first token not entirely above the top edge of pane s
    var lo = 0, hi = n - 1, st = panes[s].scrollTop;
    while (lo < hi) {
      var mid = (lo + hi) >> 1;
      if (y(s, mid) + toks[s][mid].getBoundingClientRect().height <= st) lo = mid + 1; else hi = mid;
    }
    return lo;
  }
  var expect = [null, null];
  function scroll(s, v) {  // a scroll of ours: its scroll event is not echoed back
    v = Math.max(0, Math.min(v, panes[s].scrollHeight - panes[s].clientHeight));
    if (Math.abs(panes[s].scrollTop - v) < 1) return;
    expect[s] = v;
    panes[s].scrollTop = v;
  }
  function align(s, i) {  // scroll the other pane so that token i (default: the top one of pane s) sits as high
    if (i === undefined) i = top(s);
    scroll(1 - s, y(1 - s, i) - (y(s, i) - panes[s].scrollTop));
  }
  [0, 1].forEach(function (s) {
    panes[s].addEventListener('scroll', function () {
      if (expect[s] !== null && Math.abs(panes[s].scrollTop - expect[s]) < 2) { expect[s] = null; return; }
      expect[s] = null;
      align(s);
    }, {passive: true});
  });
  var cur = -1, where = root.querySelector('.dfcmp-where');
  function shown(i) {
    var t = y(0, i);
    return t >= panes[0].scrollTop && t < panes[0].scrollTop + panes[0].clientHeight;
  }
  function go(step) {
    if (!diffs.length) return;
    var k;
    if (cur >= 0 && shown(diffs[cur])) k = cur + step;
    else {
      var t = top(0);
      k = 0;
      while (k < diffs.length && diffs[k] < t) k++;
      if (step < 0) k--;
    }
    k = (k + diffs.length) % diffs.length;
    cur = k;
    var i = diffs[k];
    root.querySelectorAll('.dfcmp-cur').forEach(function (e) { e.classList.remove('dfcmp-cur'); });
    toks[0][i].classList.add('dfcmp-cur');
    toks[1][i].classList.add('dfcmp-cur');
    scroll(0, y(0, i) - panes[0].clientHeight / 3);
    align(0, i);
    root.dataset.current = String(i);
    where.textContent = 'difference ' + (k + 1) + ' of ' + diffs.length + ' · position ' + (p0 + i);
  }
  root.querySelector('.dfcmp-next').addEventListener('click', function () { go(1); });
  root.querySelector('.dfcmp-prev').addEventListener('click', function () { go(-1); });
})();
