// Client-side navigation between dashboard pages (History API); the server answers every page path
// with the same shell, so reloads and shared links work.
let render: () => void = () => {};

export function onRoute(fn: () => void): void {
  render = fn;
  window.addEventListener('popstate', () => render());
  document.addEventListener('click', (ev) => {
    if (ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
    const a = (ev.target as Element | null)?.closest?.('a');
    const href = a?.getAttribute('href');
    if (!a || !href || !href.startsWith('/dashboard')) return;
    ev.preventDefault();
    navigate(href);
  });
}

export function navigate(path: string): void {
  history.pushState(null, '', path);
  render();
}
