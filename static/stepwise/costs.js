/* The cost page's chart (templates/admin/budgets/costs.html): spend per day as bars, the daily
 * limit in force as a line, amounts read as money (two decimals, or two significant digits
 * under a cent, as orchestrator.web.admin_display.money writes them). */
(function () {
  "use strict";
  function money(value) {
    if (!value) return "$0.00";
    if (Math.abs(value) >= 0.01) return "$" + value.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
    return "$" + Number(value.toPrecision(2)).toString();
  }
  function draw() {
    const data = JSON.parse(document.getElementById("cost-chart-data").textContent);
    const datasets = [{ type: "bar", label: "spent", data: data.values, backgroundColor: "#417690" }];
    if (data.limit !== null) {
      datasets.push({ type: "line", label: data.limit_label, data: data.labels.map(() => data.limit),
                      borderColor: "#ba2121", borderDash: [6, 4], pointRadius: 0, borderWidth: 2 });
    }
    new Chart(document.getElementById("cost-per-day"), {
      data: { labels: data.labels, datasets },
      options: {
        animation: false, maintainAspectRatio: false,
        plugins: { legend: { display: data.limit !== null },
                   tooltip: { callbacks: { label: (ctx) => `${ctx.dataset.label}: ${money(ctx.parsed.y)}` } } },
        scales: { y: { beginAtZero: true, title: { display: true, text: "USD" },
                       ticks: { callback: (value) => money(value) } } },
      },
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw);
  else draw();
})();
