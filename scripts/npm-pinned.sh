# Sourced by the setup scripts: npm_pinned PKG VERSION PREFIX installs
# PKG@VERSION into PREFIX/node_modules unless that version is there already.
# One package per prefix: npm prunes what an install did not name.

npm_installed_version() { # PKG_DIR
	[ -f "$1/package.json" ] || return 0
	sed -n 's/^[[:space:]]*"version":[[:space:]]*"\([^"]*\)".*/\1/p' "$1/package.json" | head -n1
}

npm_pinned() { # PKG VERSION PREFIX
	local pkg="$1" version="$2" prefix="$3"
	local dir="$prefix/node_modules/$pkg"
	if [ "$(npm_installed_version "$dir")" != "$version" ]; then
		echo "$(basename "$0"): installing $pkg@$version into $prefix" >&2
		mkdir -p "$prefix"
		npm install --no-save --no-audit --no-fund --loglevel=error --prefix "$prefix" "$pkg@$version" >&2
	fi
	if [ "$(npm_installed_version "$dir")" != "$version" ]; then
		echo "$(basename "$0"): $pkg@$version missing from $prefix after install" >&2
		return 1
	fi
}
