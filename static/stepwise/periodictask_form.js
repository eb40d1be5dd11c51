// django-celery-beat's crontab translation on its periodic task form, outside the page so the
// Content-Security-Policy's script-src 'self' holds (templates/admin/djcelery/).
(function () {
  "use strict";
  const $ = django.jQuery;
  const readable = JSON.parse(document.getElementById("readable-crontabs").textContent);
  const help = JSON.parse(document.getElementById("crontab-help").textContent);
  $(".field-crontab_translation").hide();
  $(".field-crontab").change(function () {
    const translation = document.createTextNode(readable[$("#id_crontab").val()] || "");
    const box = $(".field-crontab .help").empty().get(0);
    if (!box) return;
    box.append(document.createTextNode(help), document.createElement("br"),
               document.createTextNode("Translation: "), translation);
  });
})();
