// Refresh the page's <main> every few seconds without a full reload (the period is in data-refresh).
(function () {
  const seconds = Number(document.body.dataset.refresh || 0);
  if (!seconds) return;
  setInterval(async () => {
    try {
      const r = await fetch(location.href, {cache: "no-store"});
      if (!r.ok) return;
      const d = new DOMParser().parseFromString(await r.text(), "text/html");
      const fresh = d.querySelector("main");
      if (fresh) document.querySelector("main").replaceWith(fresh);
    } catch (e) { /* the next tick tries again */ }
  }, seconds * 1000);
})();
