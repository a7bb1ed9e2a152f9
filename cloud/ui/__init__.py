"""The cloud's web dashboard: static pages under static/ (served at /ui, with every asset vendored) and
the run view that its live stream sends."""
