//! `--upstream-password-file`: the password is the file's content (one
//! trailing newline removed), read again on every refresh, so a rotated
//! Kubernetes Secret mounted as a file reaches new and live connections
//! without a restart.

use std::path::PathBuf;

use sidecache_pool::auth::{SecretFuture, SecretSource};

/// A password kept in a file.
#[derive(Debug, Clone)]
pub struct PasswordFile {
    path: PathBuf,
}

impl PasswordFile {
    /// The password in `path` (read on each fetch, never cached here).
    pub fn new(path: PathBuf) -> PasswordFile {
        PasswordFile { path }
    }

    /// Reads the password now.
    ///
    /// # Errors
    /// The file cannot be read, is not UTF-8, or is empty.
    pub fn read(&self) -> Result<String, String> {
        let text = std::fs::read_to_string(&self.path)
            .map_err(|e| format!("--upstream-password-file {}: {e}", self.path.display()))?;
        let pw = text
            .strip_suffix('\n')
            .map_or(text.as_str(), |t| t.strip_suffix('\r').unwrap_or(t));
        if pw.is_empty() {
            return Err(format!(
                "--upstream-password-file {}: the file is empty",
                self.path.display()
            ));
        }
        Ok(pw.to_owned())
    }
}

impl SecretSource for PasswordFile {
    fn fetch(&self) -> SecretFuture<'_> {
        Box::pin(async move {
            let me = self.clone();
            tokio::task::spawn_blocking(move || me.read())
                .await
                .map_err(|e| e.to_string())?
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_file_without_its_newline() {
        let dir = std::env::temp_dir().join(format!("sidecache-pwfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pw");
        let f = PasswordFile::new(path.clone());
        assert!(f.read().unwrap_err().contains("--upstream-password-file"));
        std::fs::write(&path, "s3cret\n").unwrap();
        assert_eq!(f.read().unwrap(), "s3cret");
        std::fs::write(&path, "two words\r\n").unwrap();
        assert_eq!(f.read().unwrap(), "two words");
        std::fs::write(&path, "").unwrap();
        assert!(f.read().unwrap_err().contains("empty"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
