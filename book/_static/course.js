// The course book's small fixes to the theme's behaviour (linked from every page by book/_ext/course_book.py).
//
// The "On this page" button in the article header does nothing in this theme version: pydata-sphinx-theme binds its
// drawer to the first `.secondary-toggle` on the page, the navbar's, which sphinx-book-theme hides. A click on any
// other such button is passed on to that first one, so the contents drawer opens (course.css folds the contents
// panel into that drawer up to 1600 px).
document.addEventListener("DOMContentLoaded", () => {
  const [bound, ...others] = document.querySelectorAll(".secondary-toggle");
  if (!bound) return;
  others.forEach((button) =>
    button.addEventListener("click", (event) => {
      event.preventDefault();
      event.stopPropagation();
      bound.click();
    }),
  );
});
