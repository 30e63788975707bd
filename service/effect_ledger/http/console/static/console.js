// Progressive enhancement only: every page works without this file.
// On the resolve form, show the receipt part only for "committed" and the reason part only for
// "not applied", so that the form asks for what the chosen outcome needs.
(function () {
  "use strict";
  var form = document.querySelector("form.resolve");
  if (!form) { return; }
  var parts = form.querySelectorAll("fieldset[data-outcome]");
  function sync() {
    var chosen = form.querySelector("input[name=outcome]:checked");
    var value = chosen ? chosen.value : "";
    for (var i = 0; i < parts.length; i++) {
      var show = !value || parts[i].getAttribute("data-outcome") === value;
      parts[i].hidden = !show;
    }
  }
  form.addEventListener("change", sync);
  sync();
})();
