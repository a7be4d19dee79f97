//! Why a user token was refused: shared by the token dispatcher and the provider-token
//! verifier beneath it, so that neither imports the other for it.

/// Why a bearer token was refused. The detail is deliberately vague towards clients.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("missing bearer token")]
    Missing,
    /// An `Authorization` header of another scheme (`Basic …`), or of none.
    #[error("the Authorization header must use the Bearer scheme: `Authorization: Bearer <token>`")]
    WrongScheme,
    #[error("token expired")]
    Expired,
    #[error("invalid token")]
    Invalid,
    /// The provider's keys have not been read yet (`auth.oidc.start_without_keys`).
    #[error("the identity provider's keys are not available yet; retry shortly")]
    KeysUnavailable { retry_after_seconds: u64 },
}
