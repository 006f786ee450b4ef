// tip.js - the one hover box of the page (token logprobs, KV block
// details), positioned next to the pointer through the CSSOM (allowed by
// the CSP, unlike style attributes).

const tip = () => document.getElementById('tip');

// Shows the box at the pointer of ev with content (a string or a DOM
// node); content null only moves it.
export function showTip(ev, content) {
  const t = tip();
  if (content !== null && content !== undefined) {
    if (typeof content === 'string') {
      t.textContent = content;
    } else {
      t.replaceChildren(content);
    }
    t.hidden = false;
  }
  const pad = 14;
  const w = t.offsetWidth;
  const h = t.offsetHeight;
  let x = ev.clientX + pad;
  let y = ev.clientY + pad;
  if (x + w > window.innerWidth) {
    x = Math.max(0, ev.clientX - pad - w);
  }
  if (y + h > window.innerHeight) {
    y = Math.max(0, ev.clientY - pad - h);
  }
  t.style.left = `${x}px`;
  t.style.top = `${y}px`;
}

// Hides the box.
export function hideTip() {
  tip().hidden = true;
}
