/* A websocket that nudges a page to re-read its state (docs/live.md).
 *
 * liveSocket(path, reread, setStatus): calls reread() when the socket opens (so a page that
 * reconnects re-reads what it missed) and on every nudge; reconnects with a growing delay when
 * the connection drops; stops when the server refuses (code 4403). Rereads never overlap: a
 * nudge during a read marks the page dirty and one more read follows.
 */
function liveSocket(path, reread, setStatus) {
  "use strict";
  let delay = 500, reading = false, dirty = false;
  async function read() {
    if (reading) { dirty = true; return; }
    reading = true;
    try {
      do { dirty = false; await reread(); } while (dirty);
    } catch (err) {
      setStatus("error", "could not read the state: " + err);
    } finally { reading = false; }
  }
  function open() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + path);
    socket.onopen = () => { delay = 500; setStatus("live", "live"); read(); };
    socket.onmessage = () => read();
    socket.onclose = (event) => {
      if (event.code === 4403) { setStatus("error", "not allowed to watch"); return; }
      setStatus("offline", "reconnecting");
      setTimeout(open, delay);
      delay = Math.min(delay * 2, 10000);
    };
  }
  open();
  return read;
}
