//! lockext packages, old and new, for the tests of an upgrade: a private copy of the
//! server's installation (binaries, libraries, extension scripts), into which a package is
//! installed as a package manager does it, with install(1) (a new file: a running server
//! keeps the library it has mapped), while a cluster runs on it.
//!
//! The new package is the one installed in the server's installation now (`make install`).
//! A released one is built from git at its release commit, with `cargo pgrx package`, once:
//! it is kept under the target directory (`lockext-released/`). The first build compiles
//! pgrx from scratch and takes minutes.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{run_checked, PG_BIN};

/// 0.2.0 as released: the last commit whose Cargo.toml says 0.2.0 (the next one, aeebcc7,
/// starts 0.3.0). 0.1.0 cannot be built from this history: its first commit (df2afb4)
/// predates the 0.1.0 script in sql/ (no token_epoch, no token_parts), so its SQL is
/// tested with the current library only.
pub const RELEASE_0_2_0: &str = "3dd2a65036258fb499ccce8885755e7007384b21";

/// The pg_config that released packages are built against (it needs the server headers,
/// which a relocated copy of the server may not have): the one `cargo pgrx init` used.
fn build_pg_config() -> String {
    std::env::var("LOCKEXT_BUILD_PG_CONFIG")
        .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin/pg_config".to_string())
}

fn pg_config(flag: &str) -> PathBuf {
    let out = Command::new(format!("{PG_BIN}/pg_config"))
        .arg(flag)
        .output()
        .expect("run pg_config");
    assert!(out.status.success(), "pg_config {flag} failed");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A lockext package: its library and its extension files (control file, scripts).
pub struct Package {
    pub version: String,
    library: PathBuf,
    files: Vec<PathBuf>,
}

impl Package {
    /// What the server's own installation has now: the build under test.
    pub fn installed() -> Package {
        let ext = pg_config("--sharedir").join("extension");
        Package {
            version: control_version(&ext.join("lockext.control")),
            library: pg_config("--pkglibdir").join("lockext.so"),
            files: lockext_files(&ext),
        }
    }

    /// 0.2.0, built from its release commit (kept once built).
    pub fn released_0_2_0() -> Package {
        Package::built_from(RELEASE_0_2_0, "0.2.0")
    }

    fn built_from(commit: &str, version: &str) -> Package {
        let cache = target_dir()
            .join("lockext-released")
            .join(format!("{version}-{}", &commit[..12]));
        let kept = cache.join("package");
        if !kept.join("lockext.so").exists() {
            build(commit, version, &cache);
        }
        let files = lockext_files(&kept);
        assert!(
            files
                .iter()
                .any(|f| f.ends_with(format!("lockext--{version}.sql"))),
            "the {version} package has no install script: {files:?}"
        );
        Package {
            version: version.to_string(),
            library: kept.join("lockext.so"),
            files,
        }
    }
}

fn control_version(control: &Path) -> String {
    let text = fs::read_to_string(control).expect("read lockext.control");
    text.lines()
        .find_map(|l| l.strip_prefix("default_version"))
        .map(|v| {
            v.trim_start_matches([' ', '='])
                .trim()
                .trim_matches('\'')
                .to_string()
        })
        .expect("default_version in lockext.control")
}

fn lockext_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| {
                n == "lockext.control" || (n.starts_with("lockext--") && n.ends_with(".sql"))
            })
        })
        .collect();
    files.sort();
    files
}

fn target_dir() -> PathBuf {
    match option_env!("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
    }
}

/// `git archive` of `commit`, `cargo pgrx package` of it, and the package's files (with
/// the commit's older scripts from sql/) kept in `cache/package`.
fn build(commit: &str, version: &str, cache: &Path) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let src = cache.join("src");
    let _ = fs::remove_dir_all(&src);
    fs::create_dir_all(&src).expect("create the build's source dir");
    run_checked(Command::new("sh").arg("-c").arg(format!(
        "git -C {} archive {commit} | tar -x -C {}",
        repo.display(),
        src.display()
    )));
    eprintln!("building lockext {version} from {commit} (once; minutes the first time)");
    run_checked(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["pgrx", "package", "--pg-config", &build_pg_config()])
            .current_dir(&src)
            .env("CARGO_TARGET_DIR", cache.join("target")),
    );
    let built = cache.join("target/release/lockext-pg15");
    let kept = cache.join("package");
    let _ = fs::remove_dir_all(&kept);
    fs::create_dir_all(&kept).expect("create the package dir");
    let copy = |from: &Path| {
        let to = kept.join(from.file_name().expect("a file name"));
        fs::copy(from, &to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    };
    for name in [
        "lockext.so",
        "lockext.control",
        &format!("lockext--{version}.sql"),
    ] {
        copy(&find(&built, name));
    }
    // Its own older scripts, never the build directory's leftovers of other versions.
    for script in lockext_files(&src.join("sql")) {
        copy(&script);
    }
    assert_eq!(
        control_version(&kept.join("lockext.control")),
        version,
        "the package built from {commit} is not {version}"
    );
}

fn find(dir: &Path, name: &str) -> PathBuf {
    find_under(dir, name).unwrap_or_else(|| panic!("no {name} under {}", dir.display()))
}

fn find_under(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_under(&path, name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
    }
    None
}

/// A private copy of the server's installation, where packages come and go.
pub struct Server {
    /// Its binaries: start a cluster with `Cluster::pg_ctl_from(&server.bin, ...)`.
    pub bin: PathBuf,
    lib: PathBuf,
    ext: PathBuf,
}

impl Server {
    /// Copies the installation `PG_BIN` belongs to into `dir`, keeping the layout of its
    /// binaries, libraries and shared files (PostgreSQL finds the latter two relative to
    /// its own binary), with `package` installed in place of the lockext it had.
    pub fn copy_with(dir: &Path, package: &Package) -> Server {
        let (bin, lib, share) = (
            pg_config("--bindir"),
            pg_config("--pkglibdir"),
            pg_config("--sharedir"),
        );
        let root = common_root(&[&bin, &lib, &share]);
        let _ = fs::remove_dir_all(dir);
        let moved = |p: &Path| dir.join(p.strip_prefix(&root).expect("under the common root"));
        for from in [&bin, &lib, &share] {
            let to = moved(from);
            if to.exists() {
                continue; // the library directory may hold the binaries' (or the reverse)
            }
            fs::create_dir_all(to.parent().expect("a parent")).expect("create the copy's dirs");
            run_checked(Command::new("cp").arg("-a").arg(from).arg(&to));
        }
        let server = Server {
            bin: moved(&bin),
            lib: moved(&lib),
            ext: moved(&share).join("extension"),
        };
        for old in lockext_files(&server.ext) {
            fs::remove_file(&old).expect("remove the copy's lockext files");
        }
        server.install(package);
        run_checked(Command::new("chmod").arg("-R").arg("a+rX").arg(dir));
        server
    }

    /// Installs `package` over whatever lockext is there, as `make install` does: the
    /// library with install(1), which replaces the file (a running server keeps its
    /// mapped copy, and loads the new one only in backends that had not loaded it), and
    /// every extension file. Files of other versions stay, as a package manager leaves
    /// the scripts of a version it does not ship.
    pub fn install(&self, package: &Package) {
        run_checked(
            Command::new("install")
                .arg("-m")
                .arg("755")
                .arg(&package.library)
                .arg(self.lib.join("lockext.so")),
        );
        run_checked(
            Command::new("install")
                .arg("-m")
                .arg("644")
                .args(&package.files)
                .arg(&self.ext),
        );
    }
}

fn common_root(paths: &[&Path]) -> PathBuf {
    let mut root = paths[0].to_path_buf();
    while !paths.iter().all(|p| p.starts_with(&root)) {
        root = root.parent().expect("paths share the root").to_path_buf();
    }
    root
}
