// The cost page's chart of spend per day (templates/admin/budgets/costs.html): its data comes
// from the page's JSON script element, so the page needs no inline script (docs/security.md).
(function () {
  const data = JSON.parse(document.getElementById("cost-chart-data").textContent);
  new Chart(document.getElementById("cost-per-day"), {
    type: "bar",
    data: {labels: data.labels, datasets: [{label: "USD", data: data.values, backgroundColor: "#417690"}]},
    options: {animation: false, maintainAspectRatio: false, plugins: {legend: {display: false}},
              scales: {y: {beginAtZero: true, title: {display: true, text: "USD"}}}}
  });
})();
