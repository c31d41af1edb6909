"""JupyterLab for instructors editing the course (`make lab` sets JUPYTER_CONFIG_DIR to this folder).

* Saving a notebook of source/ or release/ stores it in the course's canonical form (no outputs,
  execution counts or kernel metadata): rlhf_lab.instructor.authoring.pre_save_hook.
* jupytext (installed in the course environment) pairs every notebook of source/ with its text file
  under content/ (jupytext.toml at the course root), so one save updates both.
* nbgrader's Create Assignment toolbar and Formgrader read nbgrader_config.py from the course root,
  where `make lab` starts the server.
* JupyterLab's default settings come from app-settings/overrides.json here: no "Would you like to
  get notified about official Jupyter news?" prompt, no news or update fetching. What JupyterLab
  writes while it runs (lab/user-settings, lab/workspaces, migrated) lands in this folder too and
  is ignored by git (.gitignore).
"""
import os

c = get_config()  # noqa: F821 (provided by traitlets)

c.ContentsManager.pre_save_hook = "rlhf_lab.instructor.authoring.pre_save_hook"
c.LabApp.app_settings_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "app-settings")
