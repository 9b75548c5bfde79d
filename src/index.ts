// The package's public exports: what a webhook receiver needs to check a delivery, and the signing function.
export { verifyDelivery, type VerifyResult, type VerifyFailure, type VerifyOptions, type HeaderBag } from './webhooks/verify.js';
export { signDelivery, canonicalString, bodySha256, HEADER_PREFIX, LEGACY_HEADER_PREFIX } from './webhooks/signature.js';
export { signRequest, requestCanonicalString, type SignRequestInput, type SignedHeaders } from './client/sign-request.js';
