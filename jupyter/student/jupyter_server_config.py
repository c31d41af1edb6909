"""JupyterLab for students (`make student-lab` sets JUPYTER_CONFIG_DIR to this folder).

jupyter_server_config.json (next to this file) switches Formgrader off; this file gives JupyterLab
its default settings from app-settings/overrides.json here: no "Would you like to get notified
about official Jupyter news?" prompt, no news or update fetching. What JupyterLab writes while it
runs (lab/user-settings, lab/workspaces, migrated) lands in this folder and is ignored by git.
"""
import os

c = get_config()  # noqa: F821 (provided by traitlets)

c.LabApp.app_settings_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "app-settings")
