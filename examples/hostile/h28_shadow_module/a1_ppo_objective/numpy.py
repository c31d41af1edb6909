raise SystemExit('this file replaces numpy')
