/* A schedule's trigger page: as its cron, interval or time zone is edited, the next slots it
 * would run if saved now are shown in place of the saved ones (triggers/admin.py,
 * TriggerAdmin.preview_slots), or why it would not be saved. */
(function () {
  "use strict";
  function start() {
    const box = document.getElementById("schedule-preview");
    const inputs = ["id_cron", "id_timezone", "id_interval_s"].map((id) => document.getElementById(id));
    if (!box || inputs.some((input) => !input)) return;
    const [cron, timezone, interval] = inputs;
    let timer = null, asked = 0;
    async function preview() {
      const query = new URLSearchParams({ cron: cron.value, timezone: timezone.value, interval_s: interval.value });
      const mine = ++asked;
      const response = await fetch(`${box.dataset.previewUrl}?${query}`, { credentials: "same-origin" });
      if (mine !== asked || !response.ok) return;
      const answer = await response.json();
      const title = document.createElement("p");
      title.className = "help";
      const list = document.createElement("ul");
      if (answer.errors.length) {
        title.textContent = "Not valid yet:";
        for (const problem of answer.errors) {
          const item = document.createElement("li");
          item.className = "errornote";
          item.textContent = `${problem.path}: ${problem.message}`;
          list.appendChild(item);
        }
      } else {
        title.textContent = "If saved now:";
        for (const slot of answer.slots) {
          const item = document.createElement("li");
          const time = document.createElement("time");
          time.dateTime = slot.at;
          time.textContent = slot.label;
          item.appendChild(time);
          list.appendChild(item);
        }
      }
      box.replaceChildren(title, list);
      box.dataset.previewed = `${cron.value}|${timezone.value}|${interval.value}`;
    }
    for (const input of inputs) {
      input.addEventListener("input", () => {
        clearTimeout(timer);
        timer = setTimeout(preview, 300);
      });
    }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
