/* The ☰ buttons of the page header.
 *
 * pydata-sphinx-theme 0.17 renders a sidebar toggle of its own in the top navbar (hidden by
 * sphinx-book-theme), so every page has two `.primary-toggle` and two `.secondary-toggle`
 * buttons; both themes bind their click handler with `document.querySelector`, that is to the
 * first, hidden one only (pydata-sphinx-theme #2451, sphinx-book-theme #988). The visible
 * button in the article header did nothing: no table of contents on a phone, no way to hide the
 * sidebar when projecting. This binds every other toggle the way the themes meant:
 *   - primary, at >= 992 px: hide or show the sidebar (sphinx-book-theme's `pst-sidebar-hidden`);
 *   - otherwise: open the sidebar's <dialog> with the sidebar's content moved into it, as
 *     pydata-sphinx-theme does; its own listeners on the dialog close it (backdrop, Escape) and
 *     move the content back.
 */
(function () {
  "use strict";

  function moveNodesAndClasses(from, to) {
    Array.from(from.childNodes).forEach((node) => to.appendChild(node));
    Array.from(from.classList).forEach((cls) => {
      from.classList.remove(cls);
      to.classList.add(cls);
    });
  }

  function bind(selector, sidebarId, dialogId, wideQuery) {
    const sidebar = document.getElementById(sidebarId);
    const dialog = document.getElementById(dialogId);
    if (!sidebar || !dialog) {
      return;
    }
    // The first one is the themes' own: already bound.
    Array.from(document.querySelectorAll(selector)).slice(1).forEach((button) => {
      button.addEventListener("click", (event) => {
        event.preventDefault();
        event.stopPropagation();
        button.blur();
        if (wideQuery && window.matchMedia(wideQuery).matches) {
          sidebar.classList.toggle("pst-sidebar-hidden");
          button.setAttribute("aria-expanded",
                              String(!sidebar.classList.contains("pst-sidebar-hidden")));
          return;
        }
        if (dialog.open) {
          return;
        }
        const previous = document.activeElement;
        moveNodesAndClasses(sidebar, dialog);
        dialog.showModal();
        dialog.addEventListener("close", () => previous && previous.focus && previous.focus(),
                                { once: true });
      });
    });
  }

  function setup() {
    bind(".primary-toggle", "pst-primary-sidebar", "pst-primary-sidebar-modal",
         "(min-width: 992px)");
    bind(".secondary-toggle", "pst-secondary-sidebar", "pst-secondary-sidebar-modal", null);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", setup);
  } else {
    setup();
  }
})();
